"""Shipments: actor messages that send each class, and each shared object, once per receiver.

A taskset loaded from a file is pickled *by value* (workers cannot import it), so every
message carrying one of its tasks would carry the task's class definition, and unpickling a
pydantic class rebuilds its schema: ~1.5 ms per message, the largest CPU cost of a rollout
on Ray. Here a message is pickled with each class (and each object the caller marks shared,
such as the harness and the model) replaced by a content key; the body of a key travels with
the first message that needs it, and the receiver's ``ShipmentUnpacker`` keeps what it was sent.

Keys are content hashes, so they mean the same thing in every process and a receiver shared
by many senders (a node's services actor) pools equal objects. A receiver that lacks a key
(it was replaced, or a later message overtook the first) raises ``MissingShipment``, and
``deliver`` sends again with every body attached.

The traces that come back are here too: encoded on the actor's side (``trace_to_wire``) and
decoded on the driver's (``trace_from_wire``), with a batch's ``Result``s; the host hands the
actor ``Trace`` objects and the handle gives ``Trace`` objects back, so only this module
knows the bytes of what crosses between a driver and its rollout actors.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from ray import cloudpickle

from .._errors import InfrastructureLost
from .._record.trace import Trace, decode_trace, encode_trace

T = TypeVar("T")


class MissingShipment(Exception):
    """The receiver was never sent the body of a key this message refers to."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class _Pickler(cloudpickle.CloudPickler):
    def __init__(self, file: io.BytesIO, packer: ShipmentPacker, shared: set[int]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._packer = packer
        self._shared = shared
        self.keys: set[str] = set()

    def persistent_id(self, obj: Any) -> str | None:
        if (isinstance(obj, type) and obj.__module__ != "builtins") or id(obj) in self._shared:
            key = self._packer.key_of(obj)
            self.keys.add(key)
            return key
        return None


class ShipmentPacker:
    """The sending side, for one receiver: pickles a message with each class and shared object
    replaced by its content key, and remembers which keys' bodies it has already sent.

    It remembers the last ``REMEMBERED`` objects and bodies, so a caller that makes a new
    shared object per message (budgets built per spec) costs a pickle each, never memory
    that grows with the messages. The bound is above the keys one batch of messages refers
    to (``rollout_client.MAX_BATCH`` specs of a few keys each) before its bodies are taken.
    """

    REMEMBERED = 4096

    def __init__(self) -> None:
        # id -> (object, key, body); the object is held so its id is not reused while here.
        self._bodies: OrderedDict[int, tuple[Any, str, bytes]] = OrderedDict()
        self._by_key: OrderedDict[str, bytes] = OrderedDict()
        self._sent: set[str] = set()

    def key_of(self, obj: Any) -> str:
        entry = self._bodies.get(id(obj))
        if entry is not None:  # in use: the last to be forgotten
            self._bodies.move_to_end(id(obj))
            self._by_key.move_to_end(entry[1])
        else:
            body = cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            entry = (obj, hashlib.blake2b(body, digest_size=16).hexdigest(), body)
            self._bodies[id(obj)] = entry
            self._by_key[entry[1]] = body
            self._by_key.move_to_end(entry[1])
            if len(self._bodies) > self.REMEMBERED:
                self._bodies.popitem(last=False)
            if len(self._by_key) > self.REMEMBERED:
                self._sent.discard(self._by_key.popitem(last=False)[0])
        return entry[1]

    def pack(self, message: Any, shared: Iterable[Any] = ()) -> tuple[bytes, set[str]]:
        """The message's bytes and the keys it refers to."""
        buffer = io.BytesIO()
        pickler = _Pickler(buffer, self, {id(o) for o in shared})
        pickler.dump(message)
        return buffer.getvalue(), pickler.keys

    def bodies(self, keys: Iterable[str], *, resend: bool = False) -> dict[str, bytes]:
        """The bodies of ``keys`` not yet sent (all of them with ``resend``); marks them sent."""
        out = {k: self._by_key[k] for k in keys if resend or k not in self._sent}
        self._sent.update(out)
        return out

    def forget(self) -> None:
        """The receiver was replaced: send every body again."""
        self._sent.clear()


async def deliver(
    packer: ShipmentPacker,
    message: Any,
    send: Callable[[bytes, dict[str, bytes]], Awaitable[T]],
    shared: Iterable[Any] = (),
) -> T:
    """``send(blob, bodies)`` the message; once more with every body if the receiver lacks one.

    Raises:
        InfrastructureLost: the receiver lacks a body even of the message sent with all of
            them: it was replaced (or lost what it held) under the message, as a dead actor
            is a loss of the rollout's infrastructure; its rollout is run again.
    """
    blob, keys = packer.pack(message, shared)
    try:
        return await send(blob, packer.bodies(keys))
    except MissingShipment:
        pass
    try:
        return await send(blob, packer.bodies(keys, resend=True))
    except MissingShipment as e:
        raise InfrastructureLost(
            f"the receiver lacks a body it was just sent ({e.key}): it was replaced under the message"
        ) from None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, objects: OrderedDict[str, Any]) -> None:
        super().__init__(file)
        self._objects = objects

    def persistent_load(self, key: Any) -> Any:
        try:
            self._objects.move_to_end(key)  # in use: the last to be forgotten
            return self._objects[key]
        except KeyError:
            raise MissingShipment(key) from None


class ShipmentUnpacker:
    """The receiving side: holds the objects received so far by key, and unpickles messages
    with them.

    It keeps the ``remembered`` most recently used; a message that refers to one it forgot
    raises ``MissingShipment`` and is sent again with its bodies (``deliver``).
    """

    def __init__(self, remembered: int = ShipmentPacker.REMEMBERED) -> None:
        self._objects: OrderedDict[str, Any] = OrderedDict()
        self._remembered = remembered

    def unpack(self, blob: bytes, bodies: dict[str, bytes]) -> Any:
        for key, body in bodies.items():
            if key not in self._objects:
                self._objects[key] = pickle.loads(body)  # noqa: S301 - bodies our own actors pickled, over Ray's trusted channel
                if len(self._objects) > self._remembered:
                    self._objects.popitem(last=False)
        return _Unpickler(io.BytesIO(blob), self._objects).load()

    def __len__(self) -> int:
        return len(self._objects)


Result = tuple[int, "bytes | BaseException | None"]
"""One finished rollout of a batch: its id and its trace (``trace_to_wire``), its exception,
or ``None`` (cancelled)."""


def trace_to_wire(trace: Trace) -> bytes:
    """The actor's side: the trace as it crosses to the driver."""
    return encode_trace(trace)


def trace_from_wire(data: bytes) -> Trace:
    """The driver's side: the trace ``trace_to_wire`` sent."""
    return decode_trace(data)


def portable(error: BaseException) -> Exception:
    """``error`` if it survives pickling (our errors do), else a ``RuntimeError`` naming it:
    one unpicklable exception must not lose the whole batch of results it travels with."""
    try:
        pickle.loads(pickle.dumps(error))  # noqa: S301 - a round trip of our own object, to check it pickles
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error if isinstance(error, Exception) else RuntimeError(f"{type(error).__name__}: {error}")
