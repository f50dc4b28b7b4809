"""ChatHarness: an OpenAI-style tool-calling agent loop that runs in the rollout's process.

Each segment loops until the model answers without tool calls (exit 0, the answer on
stdout) or ``max_calls`` model calls were made (also exit 0: the segment yields control). A
refused turn (``rollout stopped: ...``) ends the segment with exit 1, which the rollout
treats as clean because it stopped (B29). A model call that fails with a transient status
(429, 5xx) is retried ``retries`` times with backoff, as an SDK would.

Two transports, the same loop: ``"inprocess"`` (the default) calls the rollout's session
and tools directly (``ctx.client``, ``ctx.tools``): no HTTP, no proxy, no tool server, and
the trace has one owner; ``"http"`` speaks real HTTP to the rollout's proxy and tool
servers, as an agent outside the process would (``http_agent``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

from .._core.harness import Harness, HarnessContext
from .._core.interception import ChatClient
from .._core.runtime import ProgramResult
from .._core.tools import LocalTools
from .._errors import Refusal, RolloutError, SandboxError, ToolInputError, UpstreamError
from .._record.messages import Message, Request, Response, ToolCall, ToolMessage
from .conversation import opening, opening_messages, resumed, resumed_messages
from .http_agent import HTTPAgent

TRANSIENT = frozenset({429, 500, 502, 503, 504})


class ChatHarness(Harness):
    """An OpenAI-style tool-calling agent loop.

    Args:
        id: harness id.
        max_calls: model calls per segment.
        retries: extra attempts of a model call after a transient failure.
        request_timeout: seconds per HTTP request (``"http"`` transport).
        stream: ask for SSE streams instead of JSON completions (``"http"`` transport).
        backoff: seconds before the first retry, doubled for each further one.
        transport: ``"inprocess"`` or ``"http"`` (see the module docstring).
    """

    supports_resume = True

    def __init__(
        self,
        id: str = "chat",
        *,
        max_calls: int = 32,
        retries: int = 2,
        request_timeout: float = 600.0,
        stream: bool = False,
        backoff: float = 0.1,
        transport: Literal["inprocess", "http"] = "inprocess",
    ) -> None:
        super().__init__(id)
        if transport not in ("inprocess", "http"):
            raise ValueError(f"transport must be 'inprocess' or 'http', got {transport!r}")
        self.max_calls = max_calls
        self.retries = retries
        self.request_timeout = request_timeout
        self.stream = stream
        self.backoff = backoff
        self.transport = transport
        self.in_process = transport == "inprocess"
        self._http: HTTPAgent | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The configuration travels, a live HTTP client never does: a copy opens its own.
        return {**self.__dict__, "_http": None}

    def _agent(self) -> HTTPAgent:
        if self._http is None:
            self._http = HTTPAgent(self)
        return self._http

    async def launch(self, ctx: HarnessContext) -> ProgramResult:
        if self.in_process:
            return await self._loop(ctx, opening(ctx))
        return await self._agent().segment(ctx, opening_messages(ctx))

    async def resume(self, ctx: HarnessContext, messages: Sequence[Message]) -> ProgramResult:
        if self.in_process:
            return await self._loop(ctx, resumed(ctx, messages))
        return await self._agent().segment(ctx, resumed_messages(ctx, messages))

    # -- in process -------------------------------------------------------------------------

    async def _loop(self, ctx: HarnessContext, messages: list[Message]) -> ProgramResult:
        if ctx.client is None:
            raise RuntimeError(
                "ChatHarness(transport='inprocess') needs an in-process interception; "
                "the rollout provides one for an in_process harness"
            )
        specs = ctx.tools.specs() if ctx.tools is not None else None
        answer = ""
        for _ in range(self.max_calls):
            try:
                reply = await self._ask(ctx.client, Request(list(messages), specs or None))
            except Refusal as e:
                return ProgramResult(1, stderr=e.body)
            except (RolloutError, UpstreamError) as e:
                return ProgramResult(1, stderr=f"model call failed with {_status(e)}: {e}")
            message = reply.message
            messages.append(message)
            answer = message.content if isinstance(message.content, str) else ""
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                try:
                    messages.append(await _use_tool(ctx.tools, call))
                except SandboxError as e:
                    return ProgramResult(1, stderr=f"tool {call.name!r} failed: the rollout's runtime died: {e}")
        return ProgramResult(0, stdout=answer)

    async def _ask(self, client: ChatClient, request: Request) -> Response:
        """One model call, retried after a transient failure as an SDK would."""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                return await client.chat(request)
            except (RolloutError, UpstreamError) as e:
                if attempt == self.retries or _status(e) not in TRANSIENT:
                    raise
        raise AssertionError("unreachable")


def _status(error: Exception) -> int:
    """The HTTP status the proxy would have answered ``error`` with."""
    return getattr(error, "status_code", None) or 502


async def _use_tool(tools: LocalTools | None, call: ToolCall) -> ToolMessage:
    """The tool message: the result, or the error the model should see (bad arguments,
    unknown tool, the tool raised)."""
    if tools is None:
        content = f"error: unknown tool {call.name!r}"
    else:
        try:
            content = (await tools.call(call)).content
        except ToolInputError as e:
            content = f"error: {e}"
    return ToolMessage(tool_call_id=call.id, content=content, name=call.name)
