"""The interface of a dialect (see the package's docstring), and what every dialect shares."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..._errors import WireError
from ..._record.messages import Message, Request, Response
from ..._record.openai_codec import check_integers

UNTRANSLATABLE = "dropped: the upstream's Chat Completions request cannot express it"
"""Why a field the agent sent is recorded as dropped when no upstream request can carry it."""

History = Callable[[str], "list[Message] | None"]
"""The conversation (the messages sent and the reply) behind one of this rollout's answer ids,
or ``None`` for an id this rollout did not answer (Responses' ``previous_response_id``)."""


@dataclass
class Parsed:
    """A request read in a dialect: what the session runs, and what its answer echoes."""

    request: Request
    params: dict[str, Any]
    """The agent's other fields, in Chat Completions' names (``upstream_fields`` filters them)."""
    stream: bool
    dropped: dict[str, str] = field(default_factory=dict)
    """Fields the upstream cannot express, each with why."""
    echo: dict[str, Any] = field(default_factory=dict)
    """What of the request the dialect's answer repeats (Responses' ``instructions``...)."""
    uncarried: int = 0
    """Leading messages a continuation of this answer does not carry (Responses' instructions
    are not carried over by ``previous_response_id``)."""


class Dialect:
    """One wire format at the proxy. Subclasses set the class attributes and override
    ``parse``, ``encode`` and ``events``; the defaults here are OpenAI's."""

    name: str = ""
    endpoint: str = ""
    """The route recorded on each model call (``ModelCall.endpoint``), e.g. ``/responses``."""
    paths: tuple[str, ...] = ()
    """The routes that make a model call in this dialect (a query string is ignored)."""
    id_prefix: str = ""
    """An answer's id is the prefix and the request body's digest, so an SDK's retry, replayed
    or joined, gets the same id."""
    continued: bool = False
    """Whether a request may continue an earlier answer by its id (``History``): the proxy
    then keeps each answer's conversation for the rollout's life."""

    def secret(self, headers: Mapping[str, str]) -> str:
        """The rollout secret the agent sent (OpenAI's SDKs: ``Authorization: Bearer``)."""
        auth = headers.get("Authorization", "")
        return auth[7:].strip() if auth[:7].lower() == "bearer " else ""

    def parse(self, body: bytes, history: History) -> Parsed:
        """Read a request body.

        Raises:
            WireError: the body is not JSON, or a field has the wrong shape (``param`` names it).
        """
        raise NotImplementedError

    def encode(self, response: Response, parsed: Parsed, answer_id: str) -> bytes:
        """The JSON answer to ``parsed``."""
        raise NotImplementedError

    def events(self, response: Response, parsed: Parsed, answer_id: str) -> Iterator[bytes]:
        """The answer to ``parsed`` as server-sent events, ending with the dialect's last one."""
        raise NotImplementedError

    def error(self, status: int, message: str, kind: str, param: str | None) -> bytes:
        """An error body in the shape the dialect's SDK reads its message from."""
        return _ENCODER.encode({"error": {"message": message, "type": kind, "param": param, "code": status}})

    def side_routes(self) -> dict[str, Callable[[bytes], bytes]]:
        """Routes answered from the request body alone (no model call), path → answer."""
        return {}


def sse(event: str | None, data: Any) -> bytes:
    """One server-sent event; named when ``event`` is (Responses' and Anthropic's streams)."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + _ENCODER.encode(data) + b"\n\n"


def decode_object(body: bytes, structural: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A JSON object whose fields but the ``structural`` ones (the conversation and the tools,
    as Chat Completions' are) hold integers that fit the trace's 64 bits, or a 400 saying
    what is wrong."""
    try:
        raw = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        raise WireError(f"body is not valid JSON: {e}") from None
    except RecursionError:  # msgspec's answer to JSON nested past the recursion limit
        raise WireError("invalid request: JSON nested too deeply") from None
    if not isinstance(raw, dict):
        raise WireError(f"invalid request: the body must be a JSON object, got {_json_type(raw)}")
    for key, value in raw.items():
        if key not in structural:
            check_integers(value, key)
    return raw


_ENCODER = msgspec.json.Encoder()


MAX_ITEMS = 50_000
"""Items of any one array of a request (messages, input items, content parts, tools): more are
a 400 before they are translated one by one on the node's event loop, which a body of tiny
items (15 MiB: 500,000 of them) would stall for seconds."""


def typed(value: Any, types: type | tuple[type, ...], param: str, what: str) -> Any:
    """``value`` if it is one of ``types`` (a bool is no number; an array of at most
    ``MAX_ITEMS``), else a 400 naming ``param``."""
    wanted = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
        raise WireError(f"invalid request: `{param}` must be {what}, got {_json_type(value)}", param)
    if isinstance(value, list) and len(value) > MAX_ITEMS:
        raise WireError(
            f"invalid request: `{param}` has {len(value)} items, over the {MAX_ITEMS} a request may carry; send fewer",
            param,
        )
    return value


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
