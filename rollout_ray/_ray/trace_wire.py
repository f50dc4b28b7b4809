"""What crosses between a rollout actor and its driver: each trace as msgpack bytes, encoded on
the actor's side and decoded on the driver's (both here), and, for a batch of runs, each
result as its rollout's id and its trace, its exception or ``None``.

A trace is the one record that crosses processes (``_record.trace``'s codec); the host hands
the actor ``Trace`` objects and the handle gives ``Trace`` objects back, so only this module
knows the bytes.
"""

from __future__ import annotations

import pickle

from .._record.trace import Trace, decode_trace, encode_trace

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
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error if isinstance(error, Exception) else RuntimeError(f"{type(error).__name__}: {error}")
