"""The policy version header and its bump, the dialects' info routes, health."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from sim_client import events, user

from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer

QUESTION = {"messages": user("What is 17 + 25?")}


def run(body: Callable[[SimulatedModelServer, aiohttp.ClientSession, str], Any], **config: Any) -> Any:
    """``body(server, session, root URL)`` against a fresh server."""

    async def main() -> Any:
        async with SimulatedModelServer(SimulatedModelConfig(**{"ttft": 0, **config})) as server:
            async with aiohttp.ClientSession() as session:
                assert server.base_url is not None
                return await body(server, session, server.base_url.removesuffix("/v1"))

    return asyncio.run(main())


async def call(session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> tuple[int, str | None, Any]:
    async with session.request(method, url, **kwargs) as resp:
        raw = await resp.read()
        data = await resp.json() if resp.content_type == "application/json" else raw
        return resp.status, resp.headers.get("X-Policy-Version"), data


def test_every_response_carries_the_policy_version_and_a_test_can_bump_it() -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        chat = f"{root}/v1/chat/completions"
        assert (await call(session, "POST", chat, json=QUESTION))[:2] == (200, "3")
        server.policy_version = 4
        status, version, raw = await call(session, "POST", chat, json={**QUESTION, "stream": True})
        assert (status, version) == (200, "4") and events(raw)[-1] == "[DONE]"
        assert await call(session, "POST", f"{root}/admin/policy_version", json={"version": 9}) == (
            200,
            "9",
            {"version": 9},
        )
        assert server.policy_version == 9
        for method, url, kwargs in [
            ("POST", chat, {"json": {"messages": "x"}}),
            ("GET", f"{root}/v1/models", {}),
            ("GET", f"{root}/health", {}),
            ("GET", f"{root}/nope", {}),
        ]:
            assert (await call(session, method, url, **kwargs))[1] == "9"

    run(body, policy_version=3)


@pytest.mark.parametrize("bad", [{"version": -1}, {"version": "2"}, {"version": True}, {}, [1], None])
def test_the_admin_route_refuses_anything_but_a_version(bad: Any) -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> Any:
        data = b"{oops" if bad is None else None
        status, _, answer = await call(
            session, "POST", f"{root}/admin/policy_version", json=bad if data is None else None, data=data
        )
        assert server.policy_version == 0
        return status, answer["error"]["param"]

    assert run(body) == (400, "version")


def test_an_answer_carries_the_version_its_tokens_were_produced_under() -> None:
    """A version loaded while the request waits out its ttft is the one that writes it: the
    JSON answer (whose headers go last) says so everywhere."""

    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        payload = {**QUESTION, "return_meta_info": True}
        held = asyncio.create_task(call(session, "POST", f"{root}/v1/chat/completions", json=payload))
        while not server.engine.flights:  # admitted: it is now waiting out its ttft
            await asyncio.sleep(0.001)
        server.policy_version = 2
        _, version, data = await held
        assert version == "2" and data["metadata"] == {"weight_version": "2"}
        assert data["choices"][0]["meta_info"]["weight_version"] == "2"

    run(body, ttft=0.2, policy_version=1)


def test_vllm_serves_version_and_sglang_serves_model_info() -> None:
    async def vllm(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        assert await call(session, "GET", f"{root}/version") == (200, "0", {"version": "0.32.0+simulated"})
        assert (await call(session, "GET", f"{root}/model_info"))[0] == 404
        assert (await call(session, "GET", f"{root}/health"))[0] == 200

    async def sglang(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        assert (await call(session, "GET", f"{root}/version"))[0] == 404
        server.policy_version = 5
        for route in ("model_info", "get_model_info"):
            status, _, info = await call(session, "GET", f"{root}/{route}")
            assert status == 200 and info["weight_version"] == "5" and info["model_path"] == "sim"
            assert info["is_generation"] is True

    run(vllm)
    run(sglang, dialect="sglang", model_name="sim")


def test_each_dialect_loads_a_version_by_its_own_route_and_reports_it() -> None:
    async def vllm(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        reload = {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/3"}}  # vLLM's, a no-op here
        assert await call(session, "POST", f"{root}/collective_rpc", json=reload) == (200, "0", {"results": [None]})
        assert (await call(session, "POST", f"{root}/collective_rpc", json={"method": "sleep"}))[0] == 400
        assert await call(session, "POST", f"{root}/update_weight_version", json={"new_version": "3"}) == (
            200,
            "3",
            {"success": True, "new_version": "3"},
        )
        assert await call(session, "GET", f"{root}/weight_info") == (200, "3", {"weight_version": "3"})
        assert (await call(session, "POST", f"{root}/update_weights_from_disk", json={}))[0] == 404

    async def sglang(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        assert await call(session, "POST", f"{root}/update_weight_version", json={"new_version": "4"}) == (
            200,
            "4",
            {"success": True, "message": "Weight version updated to 4", "new_version": "4"},
        )
        assert (await call(session, "GET", f"{root}/model_info"))[2]["weight_version"] == "4"
        assert (await call(session, "GET", f"{root}/weight_info"))[0] == 404

    run(vllm)
    run(sglang, dialect="sglang")
