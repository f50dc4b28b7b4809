"""A rollout's shared state (upstream's ``Trace.state``, §5.4): one JSON object on the trace.

Setup, hooks and tools that keep state read and write ``trace.state``; a program or a tool
server in another process reads it with ``GET /state`` and replaces it with ``PUT /state``
(the proxy's state secret). A task may type it: ``Task.state_type``, a pydantic model, gives
the initial state (its defaults, as upstream starts a rollout from ``State()``) and validates
every write, so a malformed write is refused rather than read back by a reward. Without one
the state is any JSON object.
"""

from __future__ import annotations

from typing import Any

import msgspec
from pydantic import BaseModel, ValidationError


class StateRejected(ValueError):
    """A write to ``trace.state`` that is not a valid state (the message says why)."""


def initial_state(state_type: type[BaseModel] | None) -> dict[str, Any]:
    """The state a rollout starts from: ``state_type``'s defaults, or an empty object."""
    return {} if state_type is None else state_type().model_dump(mode="json")


def validated_state(raw: bytes, state_type: type[BaseModel] | None) -> dict[str, Any]:
    """The JSON object ``raw`` as a state of ``state_type`` (its JSON form).

    Raises:
        StateRejected: not a JSON object, or not valid for ``state_type``.
    """
    name = "dict" if state_type is None else state_type.__name__
    if state_type is not None:
        try:
            return state_type.model_validate_json(raw).model_dump(mode="json")
        except ValidationError as e:
            raise StateRejected(f"invalid state for {name}: {e}") from None
    try:
        value = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError) as e:
        raise StateRejected(f"invalid state for {name}: not JSON: {e}") from None
    if not isinstance(value, dict):
        raise StateRejected(f"invalid state for {name}: send a JSON object, got {type(value).__name__}")
    return value
