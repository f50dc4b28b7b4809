"""ChatHarness: an in-process agent loop that speaks real HTTP to the rollout's endpoints.

It behaves like an OpenAI-SDK agent outside the process: model calls go to
``{ctx.endpoint}/chat/completions`` with the rollout's bearer, tools are listed and called
on the tool server URLs of ``ctx.tool_urls``. Each segment loops until the model answers
without tool calls (exit 0, the answer on stdout) or ``max_calls`` model calls were made
(also exit 0: the segment yields control). A refused turn (400 ``rollout stopped: ...``)
ends the segment with exit 1, which the rollout treats as clean because it stopped (B29).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import aiohttp
import msgspec

from .._core.harness import Harness, HarnessContext
from .._core.runtime import ProgramResult
from .._errors import WireError
from .._record.messages import Message
from .._record.wire import StreamAssembler, wire_message

_STOPPED = "rollout stopped:"


class _Exit(Exception):
    """Ends the segment with exit code 1 and ``stderr``."""

    def __init__(self, stderr: str) -> None:
        super().__init__(stderr)
        self.result = ProgramResult(1, stderr=stderr)


def wire_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Our message structs as OpenAI chat message dicts."""
    return [msgspec.to_builtins(wire_message(m)) for m in messages]


def opening_messages(ctx: HarnessContext) -> list[dict[str, Any]]:
    """The system prompt (if any) then the task prompt, as OpenAI chat message dicts."""
    system, prompt = ctx.data.system_prompt, ctx.data.prompt
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    elif prompt is not None:
        messages.extend(prompt)
    return messages


def resumed_messages(ctx: HarnessContext, new: Sequence[Message]) -> list[dict[str, Any]]:
    """The trace's last branch plus ``new``; the system prompt opens a conversation yet empty."""
    history = wire_messages(ctx.trace.messages)
    if not history and ctx.data.system_prompt:
        history = [{"role": "system", "content": ctx.data.system_prompt}]
    return history + wire_messages(new)


def _error_text(raw: bytes) -> str:
    try:
        body = json.loads(raw)
        error = body["error"]
        return str(error["message"] if isinstance(error, dict) else error)
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", errors="replace")[:2000]


class ChatHarness(Harness):
    """An OpenAI-style tool-calling agent loop, in process, over HTTP.

    Args:
        id: harness id.
        max_calls: model calls per segment.
        retries: extra attempts of a model call after a 429, a 5xx or a connection error;
            retries carry ``x-stainless-retry-count`` so the proxy replays or joins them.
        request_timeout: seconds per HTTP request.
        stream: ask for SSE streams instead of JSON completions.
        backoff: seconds before the first retry, doubled for each further one.
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
    ) -> None:
        super().__init__(id)
        self.max_calls = max_calls
        self.retries = retries
        self.request_timeout = request_timeout
        self.stream = stream
        self.backoff = backoff

    async def launch(self, ctx: HarnessContext) -> ProgramResult:
        return await self._segment(ctx, opening_messages(ctx))

    async def resume(self, ctx: HarnessContext, messages: Sequence[Message]) -> ProgramResult:
        return await self._segment(ctx, resumed_messages(ctx, messages))

    async def _segment(self, ctx: HarnessContext, messages: list[dict[str, Any]]) -> ProgramResult:
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            try:
                return await self._loop(http, ctx, messages)
            except _Exit as e:
                return e.result

    async def _loop(
        self, http: aiohttp.ClientSession, ctx: HarnessContext, messages: list[dict[str, Any]]
    ) -> ProgramResult:
        specs, owners = await self._list_tools(http, ctx.tool_urls)
        answer = ""
        for _ in range(self.max_calls):
            message = await self._complete(http, ctx, messages, specs)
            messages.append(message)
            content = message.get("content")
            answer = content if isinstance(content, str) else ""
            calls = message.get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                messages.append(await self._call_tool(http, owners, call))
        return ProgramResult(0, stdout=answer)

    async def _list_tools(
        self, http: aiohttp.ClientSession, urls: dict[str, str]
    ) -> tuple[list[dict[str, Any]], dict[str, str]]:
        specs: list[dict[str, Any]] = []
        owners: dict[str, str] = {}
        for server, url in urls.items():
            try:
                async with http.get(url) as resp:
                    raw = await resp.read()
                    if resp.status != 200:
                        raise _Exit(f"tool server {server!r} answered {resp.status}: {_error_text(raw)}")
                    tools = json.loads(raw)["tools"]
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as e:
                raise _Exit(f"cannot list tools of {server!r}: {type(e).__name__}: {e}") from None
            for spec in tools:
                name = spec["function"]["name"]
                if name in owners:
                    raise _Exit(f"tool {name!r} is served twice (by {server!r} too)")
                owners[name] = url
                specs.append(spec)
        return specs, owners

    async def _call_tool(
        self, http: aiohttp.ClientSession, owners: dict[str, str], call: dict[str, Any]
    ) -> dict[str, Any]:
        """The tool message: the result, or the error the model should see (bad arguments,
        unknown tool, the tool raised)."""
        function = call.get("function") or {}
        name = function.get("name", "")
        message = {"role": "tool", "tool_call_id": call.get("id", ""), "content": "", "name": name}
        if name not in owners:
            return {**message, "content": f"error: unknown tool {name!r}"}
        body = {"name": name, "arguments": function.get("arguments") or "{}"}
        try:
            async with http.post(f"{owners[name]}/call", json=body) as resp:
                raw = await resp.read()
                if resp.status in (400, 404):
                    return {**message, "content": f"error: {_error_text(raw)}"}
                if resp.status != 200:
                    raise _Exit(f"tool {name!r} failed with {resp.status}: {_error_text(raw)}")
                return {**message, "content": str(json.loads(raw)["content"])}
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as e:
            raise _Exit(f"tool {name!r} call failed: {type(e).__name__}: {e}") from None

    async def _complete(
        self, http: aiohttp.ClientSession, ctx: HarnessContext, messages: list[dict[str, Any]],
        specs: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """One model call with SDK-style retries; returns the assistant message dict."""
        body: dict[str, Any] = {"messages": messages}
        if specs:
            body["tools"] = specs
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        data = json.dumps(body).encode()
        url = f"{ctx.endpoint}/chat/completions"
        failure = ""
        for attempt in range(self.retries + 1):
            headers = {"Authorization": f"Bearer {ctx.secret}", "Content-Type": "application/json"}
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
                headers["x-stainless-retry-count"] = str(attempt)
            try:
                async with http.post(url, data=data, headers=headers) as resp:
                    if resp.status == 200:
                        return await (self._read_stream(resp) if self.stream else self._read_json(resp))
                    error = _error_text(await resp.read())
                    if resp.status == 400 and error.startswith(_STOPPED):
                        raise _Exit(error)
                    failure = f"model call failed with {resp.status}: {error}"
                    if resp.status != 429 and resp.status < 500:
                        break
            except (aiohttp.ClientError, TimeoutError) as e:
                failure = f"model call failed: {type(e).__name__}: {e}"
        raise _Exit(failure)

    @staticmethod
    async def _read_json(resp: aiohttp.ClientResponse) -> dict[str, Any]:
        try:
            message = json.loads(await resp.read())["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise _Exit(f"malformed completion: {type(e).__name__}: {e}") from None
        message["role"] = "assistant"
        return message

    @staticmethod
    async def _read_stream(resp: aiohttp.ClientResponse) -> dict[str, Any]:
        assembler = StreamAssembler()
        try:
            async for line in resp.content:
                if line.startswith(b"data:"):
                    assembler.feed(line[5:].strip())
                    if assembler.done:
                        break
            response = assembler.response()
        except WireError as e:
            raise _Exit(str(e)) from None
        return wire_messages([response.message])[0]
