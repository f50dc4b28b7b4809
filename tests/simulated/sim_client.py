"""Helpers for the simulated model's tests: a server with a client, SSE decoding, assembly."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer

Client = Callable[..., Awaitable[tuple[int, bytes]]]
"""``await post(payload)`` (or ``post(None, raw)``): ``(status, body)`` of a chat completion."""


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def serve(body: Callable[[SimulatedModelServer, Client], Awaitable[Any]], **config: Any) -> Any:
    """Run ``body(server, post)`` against a fresh server with ``ttft=0`` and ``config``."""

    async def main() -> Any:
        async with SimulatedModelServer(SimulatedModelConfig(**{"ttft": 0, **config})) as server:
            async with aiohttp.ClientSession() as session:
                url = server.base_url

                async def post(payload: Any, raw: bytes | None = None) -> tuple[int, bytes]:
                    data = raw if raw is not None else json.dumps(payload).encode()
                    async with session.post(f"{url}/chat/completions", data=data) as resp:
                        return resp.status, await resp.read()

                return await body(server, post)

    return asyncio.run(main())


def run(body: Callable[[SimulatedModelServer, aiohttp.ClientSession, str], Awaitable[Any]], **config: Any) -> Any:
    """``body(server, session, root URL)`` against a fresh server with ``ttft=0`` and ``config``."""

    async def main() -> Any:
        async with SimulatedModelServer(SimulatedModelConfig(**{"ttft": 0, **config})) as server:
            async with aiohttp.ClientSession() as session:
                assert server.base_url is not None
                return await body(server, session, server.base_url.removesuffix("/v1"))

    return asyncio.run(main())


async def call(session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> tuple[int, Any]:
    """``(status, JSON body, SSE payloads or raw bytes)`` of one request."""
    async with session.request(method, url, **kwargs) as resp:
        raw = await resp.read()
    if raw.startswith(b"data: "):
        return resp.status, events(raw)
    return resp.status, json.loads(raw) if raw and resp.content_type == "application/json" else raw


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Wait (bounded) until ``condition()`` holds."""
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.002)


def ask(payload: Any, **config: Any) -> tuple[int, Any]:
    """One request to a fresh server: ``(status, JSON body or SSE payloads)``."""

    async def body(server: SimulatedModelServer, post: Client) -> tuple[int, Any]:
        status, raw = await post(payload)
        return status, events(raw) if raw.startswith(b"data: ") else json.loads(raw)

    return serve(body, **config)


def events(raw: bytes) -> list[Any]:
    """The SSE ``data:`` payloads of ``raw``, decoded (``[DONE]`` stays a string)."""
    out = []
    for block in raw.decode().split("\n\n"):
        block = block.strip("\n")
        if block:
            assert block.startswith("data: "), block
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def assemble(chunks: list[Any], index: int = 0) -> tuple[dict[str, Any], str | None, Any]:
    """The message, finish reason and usage a client rebuilds from choice ``index``'s chunks."""
    assert chunks[-1] == "[DONE]"
    message: dict[str, Any] = {"role": None, "content": None}
    finish, usage, calls = None, None, {}
    for chunk in chunks[:-1]:
        assert chunk["object"] == "chat.completion.chunk"
        usage = chunk.get("usage") or usage
        for choice in chunk["choices"]:
            if choice["index"] != index:
                continue
            delta = choice["delta"]
            message["role"] = delta.get("role") or message["role"]
            if delta.get("content"):
                message["content"] = (message["content"] or "") + delta["content"]
            for tc in delta.get("tool_calls") or ():
                call = calls.setdefault(tc["index"], {"function": {"arguments": ""}})
                call.update({k: tc[k] for k in ("id", "type") if tc.get(k) is not None})
                call["function"]["name"] = tc["function"].get("name") or call["function"].get("name")
                call["function"]["arguments"] += tc["function"].get("arguments") or ""
            finish = choice["finish_reason"] or finish
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, finish, usage
