"""ScriptedHarness: an in-process agent loop over the rollout's session."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from .._core.harness import Harness, HarnessContext
from .._core.runtime import ProgramResult
from .._errors import ProviderError, Refusal
from .._record.messages import Message, Request, SystemMessage, Tool, ToolMessage, UserMessage


class ScriptedHarness(Harness):
    """Chats with the model until it answers without a tool call; resumable.

    Args:
        id: harness id (in error messages and on the trace).
        tools: tool functions by name; called with the JSON arguments as keywords, their
            result (converted to ``str``) becomes the tool message.
        max_calls: model calls per segment before the segment ends.
        on_provider_error: ``"exit"`` exits 1 (as an SDK that raises would), ``"swallow"``
            exits 0 (a harness that hides the error).
        before_segment: awaited at the start of each segment with the context (tests use it
            to block, raise, or observe).
        setup: awaited by ``Harness.setup`` with the runtime.
        in_process: served in process by the rollout (default); ``False`` makes the rollout
            use the interception it was given (which must offer an in-process client, as
            ``LocalInterception`` does) and its tool server.
    """

    supports_resume = True

    def __init__(
        self,
        id: str = "scripted",
        *,
        tools: Mapping[str, Callable[..., Any]] | None = None,
        max_calls: int = 32,
        on_provider_error: Literal["exit", "swallow"] = "exit",
        before_segment: Callable[[HarnessContext], Awaitable[None]] | None = None,
        setup: Callable[[Any], Awaitable[None]] | None = None,
        in_process: bool = True,
    ) -> None:
        super().__init__(id)
        self.in_process = in_process
        self.tools = dict(tools or {})
        self.max_calls = max_calls
        self.on_provider_error = on_provider_error
        self._before_segment = before_segment
        self._setup = setup

    async def setup(self, runtime: Any) -> None:
        if self._setup is not None:
            await self._setup(runtime)

    async def launch(self, ctx: HarnessContext) -> ProgramResult:
        system, prompt = ctx.data.system_prompt, ctx.data.prompt
        messages: list[Message] = [SystemMessage(system)] if system else []
        if isinstance(prompt, str):
            messages.append(UserMessage(prompt))
        elif prompt is not None:
            messages.extend(msgspec.convert(prompt, list[Message]))
        return await self._loop(ctx, messages)

    async def resume(self, ctx: HarnessContext, messages: Sequence[Message]) -> ProgramResult:
        return await self._loop(ctx, [*ctx.trace.messages, *messages])

    async def _loop(self, ctx: HarnessContext, messages: list[Message]) -> ProgramResult:
        if self._before_segment is not None:
            await self._before_segment(ctx)
        assert ctx.client is not None, "ScriptedHarness needs an in-process interception"
        specs = [Tool(name, fn.__doc__ or "", {"type": "object"}) for name, fn in self.tools.items()]
        reply = ""
        for _ in range(self.max_calls):
            try:
                response = await ctx.client.chat(Request(list(messages), specs or None))
            except Refusal as e:
                return ProgramResult(1, stderr=f"model refused: {e.body}")
            except ProviderError as e:
                if self.on_provider_error == "swallow":
                    return ProgramResult(0, stdout=reply)
                return ProgramResult(1, stderr=f"model error: {e}")
            messages.append(response.message)
            reply = response.message.content if isinstance(response.message.content, str) else ""
            if not response.message.tool_calls:
                break
            for call in response.message.tool_calls:
                fn = self.tools[call.name]
                result = fn(**json.loads(call.arguments))
                messages.append(ToolMessage(tool_call_id=call.id, content=str(result), name=call.name))
        return ProgramResult(0, stdout=reply)
