"""A rollout's tools: one call, judged the same way however it arrives, and tools in process.

``call_tool`` is the one place a tool call is validated, run under its timeout and judged
(the HTTP tool server answers with it, an in-process harness calls it through
``LocalTools``):

* the caller's fault — an unknown tool, bad arguments — raises ``ToolInputError`` before
  anything runs (``status_code`` 404 / 400);
* the rollout's box died under the tool (a ``SandboxError`` and the runtime no longer
  alive) raises ``SandboxError``: the rollout fails, it does not go on without its box;
* the process hosting the box died (its runtime actor) raises ``InfrastructureLost``: the
  rollout is lost, not failed, and is run again;
* a tool server outside the process (an MCP server) failed raises ``ToolServerError``;
* anything else the tool raised, or its timeout, is an error *result* the model sees.

Every call that reached a toolset is reported as a ``ToolCallRecord``, its arguments and
error cut at ``MAX_TOOL_CALL_CHARS`` (``_record/capped``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import msgspec

from .._errors import InfrastructureLost, RolloutError, SandboxError, ToolInputError, ToolServerError, ToolsetError
from .._record.capped import MAX_TOOL_CALL_CHARS, capped
from .._record.messages import Tool, ToolCall
from .._record.trace import ToolCallRecord, Trace
from .runtime import Runtime
from .toolset import _NAME, DEFAULT_CALL_TIMEOUT, Toolset, _invoke, _text


@dataclass(frozen=True)
class ToolOutcome:
    """What the model sees of one call: ``content``; ``error`` says the tool failed.

    ``data``: the tool returned something other than text, and ``content`` is its JSON (MCP
    answers it as ``structuredContent`` too; read only there, so a native call pays nothing).
    """

    content: str
    error: str | None = None
    data: bool = False


def index_toolsets(toolsets: Sequence[Any]) -> dict[str, Toolset]:
    """The toolsets by server name, their schemas built now (a broken one fails the open).

    Raises:
        ToolsetError: not a ``Toolset``, or a duplicate or invalid name.
    """
    by_name: dict[str, Toolset] = {}
    for toolset in toolsets:
        if not isinstance(toolset, Toolset):
            raise ToolsetError(f"not a Toolset: {toolset!r}")
        if not _NAME.match(toolset.name) or toolset.name in by_name:
            raise ToolsetError(f"duplicate or invalid tool server name {toolset.name!r}")
        toolset.specs()
        by_name[toolset.name] = toolset
    return by_name


async def open_toolsets(toolsets: Sequence[Any], runtime: Runtime | None) -> None:
    """Let each toolset reach what it serves before its tools are listed (an MCP toolset
    connects and lists its server's tools; a native one has nothing to do).

    Raises:
        ToolServerError: a toolset's server is unreachable or not MCP.
    """
    opened: list[Toolset] = []
    try:
        for toolset in toolsets:
            if isinstance(toolset, Toolset):  # anything else fails in index_toolsets, with its reason
                await toolset._open_tools(runtime)
                opened.append(toolset)
    except BaseException:
        await close_toolsets(opened)
        raise


async def close_toolsets(toolsets: Sequence[Any]) -> None:
    """Undo ``open_toolsets`` (each toolset's close is bounded by its own client)."""
    for toolset in toolsets:
        if isinstance(toolset, Toolset):
            await toolset._close_tools()


CALLER: ContextVar[str | None] = ContextVar("rollout_ray_tool_caller", default=None)
"""The trace id of the rollout whose tool call runs in this context: a toolset that reaches a
server shared by many rollouts (an MCP server) tells it whose call it is."""


TRACE: ContextVar[Trace | None] = ContextVar("rollout_ray_tool_trace", default=None)
"""The trace of the rollout whose tool call runs in this context: a tool that keeps state
reads and writes its ``state`` (``_core/state``; a verifiers v1 toolset's ``State``)."""


@contextmanager
def calling_as(caller: str | None, trace: Trace | None = None) -> Iterator[None]:
    """Run the tool calls inside as ``caller``'s (``CALLER``), on ``trace`` (``TRACE``)."""
    token, on = CALLER.set(caller), TRACE.set(trace)
    try:
        yield
    finally:
        TRACE.reset(on)
        CALLER.reset(token)


async def call_tool(
    toolset: Toolset,
    name: str,
    arguments: Any,
    runtime: Runtime | None,
    *,
    timeout: float = DEFAULT_CALL_TIMEOUT,
    on_call: Callable[[ToolCallRecord], None] | None = None,
) -> ToolOutcome:
    """Run tool ``name`` of ``toolset`` with ``arguments`` (a dict, or its JSON text).

    Raises:
        ToolInputError: unknown tool, or arguments that do not fit it (nothing ran).
        SandboxError: the rollout's runtime died under the tool.
        InfrastructureLost: the process hosting the runtime died under the tool.
        ToolServerError: the MCP server behind ``toolset`` failed (not the tool's own error).
    """
    if toolset.call_timeout is not None:  # the toolset's own bound wins over the server's
        timeout = toolset.call_timeout
    started, deadline = time.monotonic(), asyncio.timeout(timeout)
    fn, outcome = None, None
    failure: RolloutError | InfrastructureLost | None = None
    try:
        if isinstance(arguments, str):  # OpenAI tool calls carry their arguments as JSON text
            try:
                arguments = msgspec.json.decode(arguments)
            except (msgspec.DecodeError, RecursionError) as e:
                raise ToolInputError(f"invalid arguments for tool {name!r}: not JSON: {e}", 400) from None
        fn, kwargs = toolset._bind(name, arguments, runtime)
        async with deadline:
            result = await _invoke(fn, kwargs)
        outcome = ToolOutcome(_text(result), data=not isinstance(result, str))
    except Exception as e:  # noqa: BLE001 - a tool's exception is its result, returned to the model
        if (fn is None and isinstance(e, ToolInputError)) or isinstance(e, (InfrastructureLost, ToolServerError)):
            failure = e
        elif isinstance(e, SandboxError):
            failure = await _box_gone(e, runtime)
        if failure is None:
            expired = isinstance(e, TimeoutError) and deadline.expired()
            text = f"tool {name!r} timed out after {timeout:g}s" if expired else f"{type(e).__name__}: {e}"
            outcome = ToolOutcome(text, error=text)
    if on_call is not None:
        if outcome is not None:
            error = outcome.error
        elif isinstance(failure, ToolInputError):
            error = str(failure)
        else:
            error = f"{type(failure).__name__}: {failure}"
        on_call(_record(toolset.name, name, arguments, error, time.monotonic() - started))
    if failure is not None:
        raise failure
    assert outcome is not None
    return outcome


async def _box_gone(error: SandboxError, runtime: Runtime | None) -> SandboxError | InfrastructureLost | None:
    """What a tool's ``SandboxError`` fails the rollout with: itself if the box died, the loss
    if the box's host did (asking is how it shows), ``None`` if the box lives (the tool's own
    failure: a result the model sees)."""
    try:
        return None if runtime is not None and await runtime.alive() else error
    except InfrastructureLost as lost:
        return lost


def _record(server: str, name: str, arguments: Any, error: str | None, seconds: float) -> ToolCallRecord:
    """The call's record, its texts cut at ``MAX_TOOL_CALL_CHARS``: a rollout's trace lives
    as long as the rollout, and what a program sends its tools must not grow it unbounded."""
    text = msgspec.json.encode(arguments).decode()
    return ToolCallRecord(
        server,
        name,
        capped(text, MAX_TOOL_CALL_CHARS),
        error is None,
        None if error is None else capped(error, MAX_TOOL_CALL_CHARS),
        seconds,
        arguments_chars=len(text) if len(text) > MAX_TOOL_CALL_CHARS else None,
    )


class LocalTools:
    """A rollout's toolsets served to a harness in the same process: no server, no URL.

    Args:
        toolsets: the task's toolsets.
        runtime: the rollout's runtime (for tools that take one).
        on_call: receives every call's record (the rollout's ``trace.tool_calls.append``).
        timeout: seconds one call may run.
        caller: the rollout's trace id, which its calls carry to a shared server (``CALLER``).
        trace: the rollout's trace, whose ``state`` its tools read and write (``TRACE``).
    """

    def __init__(
        self,
        toolsets: Sequence[Any],
        runtime: Runtime | None,
        *,
        on_call: Callable[[ToolCallRecord], None] | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT,
        caller: str | None = None,
        trace: Trace | None = None,
    ) -> None:
        self._owners: dict[str, Toolset] = {}
        self._specs: list[Tool] = []
        for toolset in index_toolsets(toolsets).values():
            for spec in toolset.specs():
                if spec.name in self._owners:
                    raise ToolsetError(f"tool {spec.name!r} is served twice (by {toolset.name!r} too)")
                self._owners[spec.name] = toolset
                self._specs.append(spec)
        self._runtime, self._on_call, self._timeout, self._caller = runtime, on_call, timeout, caller
        self._trace = trace
        self.calling: list[float] = []
        """When each tool call running now began (a live run's status reads them)."""

    def specs(self) -> list[Tool]:
        """Every tool, as offered to the model."""
        return list(self._specs)

    async def call(self, call: ToolCall) -> ToolOutcome:
        """Run one tool call of the model.

        Raises: as ``call_tool`` (an unknown tool is a ``ToolInputError`` too).
        """
        toolset = self._owners.get(call.name)
        if toolset is None:
            raise ToolInputError(f"unknown tool {call.name!r}", 404)
        started = time.time()
        self.calling.append(started)
        try:
            with calling_as(self._caller, self._trace):
                return await call_tool(
                    toolset, call.name, call.arguments, self._runtime, timeout=self._timeout, on_call=self._on_call
                )
        finally:
            self.calling.remove(started)


def tool_specs(specs: Sequence[Tool]) -> list[Mapping[str, Any]]:
    """OpenAI ``tools`` entries for ``specs``."""
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in specs
    ]
