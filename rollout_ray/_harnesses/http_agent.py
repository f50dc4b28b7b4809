"""ChatHarness's HTTP transport: the agent loop as an OpenAI-SDK agent outside would run it.

Model calls go to ``{ctx.endpoint}/chat/completions`` with the rollout's bearer, retried on
429 / 5xx / connection errors with ``x-stainless-retry-count`` (the proxy replays or joins
them); tools are listed and called on the tool server URLs of ``ctx.tool_urls``. One
keep-alive client per harness serves every segment running at once (of every rollout); it
is closed when the last of them ends.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

import aiohttp

from .._core.harness import HarnessContext
from .._core.runtime import ProgramResult
from .._errors import WireError
from .._record.openai_stream import StreamAssembler
from .conversation import wire_messages

_STOPPED = "rollout stopped:"


class _Exit(Exception):
    """Ends the segment with exit code 1 and ``stderr``."""

    def __init__(self, stderr: str) -> None:
        super().__init__(stderr)
        self.result = ProgramResult(1, stderr=stderr)


def _error_text(raw: bytes) -> str:
    try:
        body = json.loads(raw)
        error = body["error"]
        return str(error["message"] if isinstance(error, dict) else error)
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", errors="replace")[:2000]


class LoopSettings(Protocol):
    """What the loop reads of its harness (a ``ChatHarness``), each time it reads it."""

    max_calls: int
    retries: int
    request_timeout: float
    stream: bool
    backoff: float


class HTTPAgent:
    """The loop of one ChatHarness over HTTP; ``segment`` runs one segment."""

    def __init__(self, harness: LoopSettings) -> None:
        self.harness = harness
        self._client: aiohttp.ClientSession | None = None
        self._segments = 0

    async def segment(self, ctx: HarnessContext, messages: list[dict[str, Any]]) -> ProgramResult:
        if self._client is None:
            timeout = aiohttp.ClientTimeout(total=self.harness.request_timeout)
            # No connection cap: the harness's in-flight calls are bounded by the rollouts'.
            self._client = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))
        client = self._client
        self._segments += 1
        try:
            return await self._loop(client, ctx, messages)
        except _Exit as e:
            return e.result
        finally:
            self._segments -= 1
            if not self._segments and self._client is client:
                self._client = None
                await client.close()

    async def _loop(
        self, http: aiohttp.ClientSession, ctx: HarnessContext, messages: list[dict[str, Any]]
    ) -> ProgramResult:
        specs, owners = await self._list_tools(http, ctx.tool_urls)
        answer = ""
        for _ in range(self.harness.max_calls):
            message = await self._complete(http, ctx, messages, specs)
            messages.append(message)
            content = message.get("content")
            answer = content if isinstance(content, str) else ""
            calls = message.get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                messages.append(await self._call_tool(http, owners, call))  # noqa: PERF401 - one at a time, kept if a later one raises
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
        self,
        http: aiohttp.ClientSession,
        ctx: HarnessContext,
        messages: list[dict[str, Any]],
        specs: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """One model call with SDK-style retries; returns the assistant message dict."""
        body: dict[str, Any] = {"messages": messages}
        if specs:
            body["tools"] = specs
        if self.harness.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        data = json.dumps(body).encode()
        url = f"{ctx.endpoint}/chat/completions"
        failure = ""
        for attempt in range(self.harness.retries + 1):
            headers = {"Authorization": f"Bearer {ctx.secret}", "Content-Type": "application/json"}
            if attempt:
                await asyncio.sleep(self.harness.backoff * 2 ** (attempt - 1))
                headers["x-stainless-retry-count"] = str(attempt)
            try:
                async with http.post(url, data=data, headers=headers) as resp:
                    if resp.status == 200:
                        return await (self._read_stream(resp) if self.harness.stream else self._read_json(resp))
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
        return message  # type: ignore[no-any-return]

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
