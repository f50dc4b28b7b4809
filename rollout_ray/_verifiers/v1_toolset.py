"""A v1 task's ``vf.Toolset`` as our ``Toolset``: its ``@vf.tool`` methods are our tools,
named as upstream's chat program names them to the model (``<server>_<tool>``, bare when
``TOOL_PREFIX`` is ``None``), their schemas built from the same signatures.

Upstream serves each toolset as an MCP server in a process of its own per rollout; ours
calls the same methods in the rollout's tool server, one toolset object per rollout. A
toolset that keeps ``State`` has it synced around each call as upstream's server syncs it
over ``/state``: pulled from the calling rollout's ``trace.state`` (``_core/tools.TRACE``)
before the call, pushed back after it when it changed. What this cannot give is refused: a
toolset with a ``setup_task``, or a server at a ``url``.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import BaseModel

from .._core.tools import TRACE
from .._core.toolset import _MARK, Toolset
from .v1_state import state_type


def refusal(upstream: Any) -> str | None:
    """Why the v1 toolset ``upstream`` cannot be mapped, or ``None``."""
    from verifiers.v1.mcp.server import ServerBase
    from verifiers.v1.mcp.toolset import Toolset as UpstreamToolset

    cls, name = type(upstream), type(upstream).__name__
    if not isinstance(upstream, UpstreamToolset):
        return f"its toolset {name} is not a vf.Toolset (an MCP server of its own)"
    if cls.setup_task is not ServerBase.setup_task:
        return f"its toolset {name} overrides setup_task()"
    if getattr(upstream.config, "url", None):
        return f"its toolset {name} is a server at a url"
    return None


@functools.cache
def toolset_class(upstream_cls: type) -> type[Toolset]:
    """Our ``Toolset`` class for one v1 toolset class (placed in its module, as
    ``v1_task.adapter_class``, so a ``.py`` taskset ships to Ray workers by value)."""
    from verifiers.v1.utils.decorators import discover_decorated

    probe: Any = object.__new__(upstream_cls)  # discover_decorated reads the class's methods only
    prefix = upstream_cls.server_name.fget(probe)  # type: ignore[attr-defined]
    members: dict[str, Any] = {}
    for fn in discover_decorated(probe, "tool"):
        tool = getattr(fn, "tool_name", None) or fn.__name__
        members[fn.__name__] = _as_our_tool(fn.__func__, f"{prefix}_{tool}" if prefix else tool)
    return type(
        upstream_cls.__name__,
        (_V1Toolset,),
        {
            "name": prefix or upstream_cls.__name__.lower(),
            "__module__": upstream_cls.__module__,
            "__qualname__": f"{upstream_cls.__qualname__}.rollout_ray",
            "state_type": state_type(upstream_cls),
            **members,
        },
    )


class _V1Toolset(Toolset):
    """Holds the v1 toolset's config; the v1 object itself is made (and its ``setup()``
    run) on the first call where the tools are served, so only the config travels."""

    state_type: ClassVar[type[BaseModel] | None] = None
    """The toolset's ``State`` model (``None``: it keeps none, nothing to sync)."""

    def __init__(self, upstream: Any) -> None:
        self._cls, self._config = type(upstream), upstream.config
        self._upstream: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_upstream": None}

    async def _v1(self) -> Any:
        if self._upstream is None:
            upstream = self._cls(self._config)
            await upstream.setup()
            self._upstream = upstream
        return self._upstream


def _as_our_tool(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A method of ours calling ``fn`` on the v1 toolset, with ``fn``'s signature and its
    annotations resolved here (our schema builder reads them in our module's globals)."""

    async def call(self: _V1Toolset, **arguments: Any) -> Any:
        method = getattr(await self._v1(), fn.__name__)
        if self.state_type is None:
            result = method(**arguments)
            return await result if inspect.isawaitable(result) else result
        return await _with_state(self.state_type, lambda: method(**arguments))

    call.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    call.__annotations__ = typing.get_type_hints(fn)
    call.__name__, call.__doc__ = fn.__name__, fn.__doc__
    setattr(call, _MARK, name)
    return call


async def _with_state(model: type[BaseModel], call: Callable[[], Any]) -> Any:
    """``call()`` with upstream's per-call state (what a v1 tool reads as ``self.state``) set
    from the calling rollout's ``trace.state``, written back when it changed. Without a
    rollout (a call outside one), a fresh state, as upstream's server without a channel."""
    from verifiers.v1.mcp.server import _call_state  # upstream's per-call state (pinned 0.4.0)

    trace = TRACE.get()
    state = model.model_validate(trace.state) if trace is not None else model()
    token = _call_state.set(state)
    try:
        result = call()
        if inspect.isawaitable(result):
            result = await result
    finally:
        _call_state.reset(token)
    after = state.model_dump(mode="json")
    if trace is not None and after != trace.state:
        trace.state = after
    return result
