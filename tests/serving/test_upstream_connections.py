"""The model client has no connection cap of its own: every call in flight reaches the server.

A cap (it was 1,024 per process) silently queues calls beyond it: at 10,000 rollouts in flight
most would wait for a connection while the budget clock runs.
"""

from __future__ import annotations

import asyncio
import json
import resource

import pytest
from aiohttp import web

from rollout_ray import Request, UserMessage
from rollout_ray._serving.upstream import OpenAIModel

CALLS = 1100  # beyond the old cap of 1,024


def _answer() -> web.Response:
    body = {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "4"}}],
    }
    return web.Response(text=json.dumps(body), content_type="application/json")


def test_more_calls_than_the_old_cap_are_all_at_the_server_at_once() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 3 * CALLS:
        pytest.skip(f"the open-files hard limit ({hard}) is below {3 * CALLS}")

    async def main() -> tuple[int, list[str]]:
        arrived = 0
        everyone: asyncio.Event = asyncio.Event()

        async def chat(request: web.Request) -> web.Response:
            nonlocal arrived
            arrived += 1
            if arrived == CALLS:
                everyone.set()
            await asyncio.wait_for(everyone.wait(), 30)  # raises (a 500) if some never arrive
            return _answer()

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4 * CALLS)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        model = OpenAIModel(f"http://127.0.0.1:{port}/v1", name="m", retries=0)
        try:
            request = Request([UserMessage(content="2+2?")])
            replies = await asyncio.gather(*(model.complete(request, model=None, sampling={}) for _ in range(CALLS)))
        finally:
            await model.aclose()
            await runner.cleanup()
        return arrived, [r.message.content for r in replies]

    arrived, texts = asyncio.run(main())
    assert arrived == CALLS and texts == ["4"] * CALLS
