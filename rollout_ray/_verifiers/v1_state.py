"""A v1 task's ``State`` on our trace: ``trace.state`` is a JSON object here, and v1 code reads
and writes a typed one (``trace.state.count += 1``; a toolset's ``self.state``). So the v1
code gets a view of our trace whose ``state`` is the task's ``State`` model, validated from the
JSON object, and what it changed is written back as JSON when the call returns (last write
wins, as upstream's ``PUT /state``)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from .._record.trace import Trace


def state_type(upstream_cls: type) -> type[BaseModel] | None:
    """The ``State`` model a v1 task or toolset class declares, or ``None`` for the base one
    (nothing to sync: upstream syncs only subclasses)."""
    from verifiers.v1.state import State, state_cls

    cls = state_cls(upstream_cls)
    return None if cls is State else cls


class V1Trace:
    """Our ``trace`` as v1 code reads it: every member ours, ``state`` typed."""

    def __init__(self, trace: Trace, state: BaseModel) -> None:
        object.__setattr__(self, "_trace", trace)
        object.__setattr__(self, "state", state)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trace, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "state":
            object.__setattr__(self, name, value)
        else:
            setattr(self._trace, name, value)


async def with_typed_state(
    trace: Trace, model: type[BaseModel] | None, call: Callable[[Any], Any | Awaitable[Any]]
) -> Any:
    """``call(trace)`` with our ``trace`` seen through ``V1Trace`` (ours as is when ``model``
    is ``None``), and the typed state written back as JSON if it changed."""
    if model is None or not isinstance(trace, Trace):
        result = call(trace)
        return await result if inspect.isawaitable(result) else result
    view = V1Trace(trace, model.model_validate(trace.state))
    result = call(view)
    if inspect.isawaitable(result):
        result = await result
    after = view.state.model_dump(mode="json")
    if after != trace.state:
        trace.state = after
    return result
