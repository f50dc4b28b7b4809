"""A real proxy in front of real simulated model servers, for the token-capture and affinity tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from rollout_ray import RolloutSession, Trace, TraceTask
from rollout_ray._core.interception import Slot
from rollout_ray._record.messages import Response
from rollout_ray._record.openai_stream import StreamAssembler
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer

QUESTION = [{"role": "user", "content": "What is 2+2?"}]


@dataclass
class Rig:
    proxy: HTTPInterception
    model: OpenAIModel
    client: aiohttp.ClientSession
    servers: list[SimulatedModelServer]
    sessions: list[RolloutSession] = field(default_factory=list)
    slots: list[Slot] = field(default_factory=list)
    stack: AsyncExitStack = field(default_factory=AsyncExitStack)

    async def open_session(self) -> tuple[RolloutSession, Slot]:
        session = RolloutSession(Trace(task=TraceTask(type="T")), self.model)
        slot = await self.stack.enter_async_context(self.proxy.serve(session))
        self.sessions.append(session)
        self.slots.append(slot)
        return session, slot

    def last_response(self, slot: Slot) -> Response:
        response = self.proxy._by_model[slot.model_secret].last_response
        assert response is not None
        return response

    async def post(self, slot: Slot, body: dict[str, Any]) -> tuple[int, Any]:
        """``(status, JSON body)``; a stream is assembled as a client would, into a dict."""
        auth = {"Authorization": f"Bearer {slot.model_secret}"}
        async with self.client.post(f"{slot.base_url}/v1/chat/completions", json=body, headers=auth) as resp:
            raw = await resp.read()
            if not raw.startswith(b"data:"):
                return resp.status, msgspec.json.decode(raw)
        return resp.status, sse(raw)


def sse(raw: bytes) -> dict[str, Any]:
    """The chunks of an SSE answer, and what a client folds them into."""
    chunks = [block[5:].strip() for block in raw.split(b"\n\n") if block.startswith(b"data:")]
    assembler = StreamAssembler(logprobs=True)
    for chunk in chunks:
        assembler.feed(chunk)
    response = assembler.response()
    decoded = [msgspec.json.decode(c) for c in chunks[:-1]]
    return {
        "chunks": decoded,
        "content": response.message.content,
        "finish_reason": response.finish_reason,
        "logprobs": msgspec.to_builtins(response.logprobs),
    }


@asynccontextmanager
async def rig(*configs: SimulatedModelConfig, **model: Any) -> AsyncIterator[Rig]:
    """Servers for ``configs`` (one default server if none), ``OpenAIModel(**model)`` over
    them all, and the proxy; sessions are opened with ``Rig.open_session``."""
    async with AsyncExitStack() as outer:
        servers = [
            await outer.enter_async_context(SimulatedModelServer(c)) for c in configs or (SimulatedModelConfig(ttft=0),)
        ]
        urls = [s.base_url for s in servers]
        openai = OpenAIModel(urls if len(urls) > 1 else urls[0], name="simulated", **model)  # type: ignore[arg-type]
        outer.push_async_callback(openai.aclose)
        proxy = await outer.enter_async_context(HTTPInterception())
        client = await outer.enter_async_context(aiohttp.ClientSession())
        it = Rig(proxy, openai, client, servers)
        async with it.stack:
            yield it


@asynccontextmanager
async def recording_server(
    answer: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None,
    extra_routes: list[web.RouteDef] = (),  # type: ignore[assignment]
) -> AsyncIterator[tuple[str, list[web.Request], list[bytes]]]:
    """A plain OpenAI-compatible server (no info routes, unless ``extra_routes``) answering
    "4"; records each chat request and its body."""
    seen: list[web.Request] = []
    bodies: list[bytes] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        bodies.append(await request.read())
        if answer is not None:
            return await answer(request)
        return web.json_response(
            {"choices": [{"message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}], "model": "plain"}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_routes(extra_routes)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1", seen, bodies
    finally:
        await runner.cleanup()


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(fn())
