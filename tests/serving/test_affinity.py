"""Session affinity: X-Session-ID upstream, least-in-flight then bounded-load affinity, failover
(the policies compared on the capacity model: ``test_routing.py``).

Real proxy, real simulated servers on 127.0.0.1; the pool's clock is a fake, so cooldowns
pass when the test says so.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from capture_rig import QUESTION, Rig, recording_server, rig, run

from rollout_ray import RolloutSession, Trace, TraceTask
from rollout_ray._core.interception import Slot
from rollout_ray._serving.affinity import ServerPool
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.config import SimulatedModelConfig


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def turn(r: Rig, slot: Slot, conversation: list[Any], text: str) -> int:
    """Send the next user turn of ``conversation``; returns the index of the server that answered."""
    before = [s.stats.requests for s in r.servers]
    conversation.append({"role": "user", "content": text})
    status, body = await r.post(slot, {"messages": conversation})
    assert status == 200, body
    conversation.append(body["choices"][0]["message"])
    grew = [i for i, s in enumerate(r.servers) if s.stats.requests > before[i]]
    return grew[-1]


def three(**config: Any) -> list[SimulatedModelConfig]:
    return [SimulatedModelConfig(ttft=0, **config) for _ in range(3)]


def test_upstream_requests_carry_the_trace_id_as_x_session_id() -> None:
    async def main() -> None:
        async with recording_server() as (url, seen, _), HTTPInterception() as proxy, aiohttp.ClientSession() as client:
            model = OpenAIModel(url)
            sessions = [RolloutSession(Trace(task=TraceTask(type="T")), model) for _ in range(2)]
            for session in sessions:
                async with proxy.serve(session) as slot:
                    auth = {"Authorization": f"Bearer {slot.model_secret}"}
                    async with client.post(
                        f"{slot.base_url}/v1/chat/completions", json={"messages": QUESTION}, headers=auth
                    ) as resp:
                        assert resp.status == 200
            await model.aclose()
            assert [r.headers["X-Session-ID"] for r in seen] == [s.trace.id for s in sessions]

    run(main)


def test_first_calls_spread_over_the_servers_then_each_session_sticks() -> None:
    async def main() -> None:
        async with rig(*three(), backoff=0) as r:
            opened = [await r.open_session() for _ in range(6)]
            conversations: list[list[Any]] = [[] for _ in opened]
            first = [await turn(r, slot, c, "What is 2+2?") for (_, slot), c in zip(opened, conversations)]
            assert sorted(first) == [0, 0, 1, 1, 2, 2]
            for k in (3, 4):
                later = [await turn(r, slot, c, f"What is {k}+{k}?") for (_, slot), c in zip(opened, conversations)]
                assert later == first

    run(main)


def test_a_killed_server_is_taken_out_its_sessions_move_and_it_returns_after_the_cooldown() -> None:
    async def main() -> None:
        clock = Clock()
        async with rig(*three(), backoff=0, retries=0, cooldown=30.0) as r:
            r.model.pool.clock = clock
            opened = [await r.open_session() for _ in range(6)]
            conversations: list[list[Any]] = [[] for _ in opened]
            first = [await turn(r, slot, c, "What is 2+2?") for (_, slot), c in zip(opened, conversations)]
            killed = first[0]
            port = int(r.servers[killed].base_url.rsplit(":", 1)[1].split("/")[0])  # type: ignore[union-attr]
            await r.servers[killed].stop()
            second = [await turn(r, slot, c, "What is 3+3?") for (_, slot), c in zip(opened, conversations)]
            for before, after in zip(first, second):
                assert after == before if before != killed else after != killed
            assert r.model.pool.servers[killed].down_until == clock.now + 30.0
            third = [await turn(r, slot, c, "What is 4+4?") for (_, slot), c in zip(opened, conversations)]
            assert third == second  # moved sessions stay where they went
            assert all(len(c) == 6 for c in conversations)
            # Back on its port; once the cooldown is over it takes new sessions again.
            await r.servers[killed].start(port=port)
            clock.now += 30.0
            fresh = [await r.open_session() for _ in range(3)]
            landed = [await turn(r, slot, [], "What is 5+5?") for _, slot in fresh]
            assert killed in landed

    run(main)


def test_a_server_failing_with_5xx_for_two_sessions_is_taken_out_and_each_call_moves_on() -> None:
    async def main() -> None:
        configs = [SimulatedModelConfig(ttft=0, rate_5xx=1.0), *three()[:2]]
        async with rig(*configs, backoff=0, retries=2) as r:
            clock = r.model.pool.clock = Clock()
            opened = [await r.open_session() for _ in range(6)]
            landed = [await turn(r, slot, [], "What is 2+2?") for _, slot in opened]
            assert 0 not in landed  # every call moved on: the session alone, then everyone
            # The third session's three failures moved it alone; the fifth's one failure was
            # a second session's, which took the server out.
            assert r.servers[0].stats.requests == 4 and set(r.servers[0].stats.by_status) <= {500, 502, 503}
            assert r.model.pool.servers[0].down_until == clock.now + 10.0

    run(main)


def test_every_server_down_still_tries_the_one_back_soonest() -> None:
    clock = Clock()
    pool = ServerPool(["http://a/v1", "http://b/v1"], cooldown=10.0, clock=clock)
    a, b = pool.servers
    assert pool.failed(a, unreachable=True) is True
    clock.now += 1
    assert pool.failed(b, unreachable=True) is False  # nobody left to move to
    assert pool.pick("s") is a


def test_least_in_flight_picks_the_idlest_server_for_a_new_session() -> None:
    pool = ServerPool(["http://a/v1", "http://b/v1", "http://c/v1"], routing="sticky")
    for server, load in zip(pool.servers, (2, 0, 1)):
        server.inflight = load
    assert pool.pick("new").url == "http://b/v1"
    pool.servers[1].inflight = 5
    assert pool.pick("new").url == "http://b/v1"  # sticky, whatever the load now
    assert pool.pick(None).url == "http://c/v1"  # no session: no affinity


def test_affinity_keeps_a_session_until_its_server_is_past_the_bounded_load_then_moves_it() -> None:
    pool = ServerPool(["http://a/v1", "http://b/v1", "http://c/v1"], balance=1.25)
    a, b, c = pool.servers
    b.inflight = c.inflight = 1
    assert pool.pick("s") is a
    a.inflight, b.inflight, c.inflight = 3, 2, 3  # 8 in flight: bound ceil(1.25 * 9 / 3) = 4, a takes a 4th
    assert pool.pick("s") is a
    a.inflight = 5  # a 6th would be past ceil(1.25 * 11 / 3) = 5: the session moves to the idlest
    assert pool.pick("s") is b and pool.session_server("s") is b
    a.inflight = 0
    assert pool.pick("s") is b  # and stays where its prefix now is (3 <= ceil(1.25 * 6 / 3))


def test_least_loaded_and_round_robin_ignore_the_session() -> None:
    least = ServerPool(["http://a/v1", "http://b/v1"], routing="least_loaded")
    least.servers[0].inflight = 1
    assert [least.pick("s").url for _ in range(2)] == ["http://b/v1"] * 2
    least.servers[1].inflight = 2
    assert least.pick("s").url == "http://a/v1"
    rr = ServerPool(["http://a/v1", "http://b/v1"], routing="round_robin")
    assert [rr.pick("s").url for _ in range(4)] == ["http://b/v1", "http://a/v1"] * 2


def test_the_sticky_table_is_bounded() -> None:
    pool = ServerPool(["http://a/v1", "http://b/v1"], max_sessions=2)
    for s in ("s1", "s2", "s3"):
        pool.pick(s)
    assert pool.session_server("s1") is None and pool.session_server("s3") is not None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cooldown": -1.0}, r"^`cooldown` must be >= 0, got -1.0$"),
        ({"max_failures": 0}, r"^`max_failures` must be >= 1, got 0$"),
        ({"balance": 0.5}, r"^`balance` must be >= 1 \(1: no server above the mean load\), got 0.5$"),
        (
            {"routing": "hash"},
            r"^`routing` must be one of 'affinity', 'sticky', 'least_loaded', 'round_robin', got 'hash'$",
        ),
    ],
)
def test_pool_settings_are_checked(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServerPool(["http://a/v1"], **kwargs)


def test_base_url_needs_a_server_and_token_capture_a_known_dialect() -> None:
    with pytest.raises(ValueError, match=r"^`base_url` must name at least one server$"):
        OpenAIModel([])
    with pytest.raises(ValueError, match=r"^`token_capture` must be 'vllm', 'sglang', 'auto' or None, got 'tgi'$"):
        OpenAIModel("http://a/v1", token_capture="tgi")  # type: ignore[arg-type]


HUGE = 256 << 10
"""Requests larger than this time out upstream, as a huge prompt would on a real server."""


@pytest.mark.faults
def test_one_rollouts_timeouts_take_no_server_away_from_the_others(report: Any) -> None:
    """Issue 21 §5: a rollout whose requests time out (they are huge) moves itself, not the
    server's other sessions, and the server stays in rotation (two sessions failing there is
    the server's fault, and takes it out: the 5xx test above)."""
    held = asyncio.Event()

    async def answer(request: web.Request) -> web.Response:
        if len(await request.read()) > HUGE:
            await held.wait()  # set as the test ends: only the model's timeout ends it before
        return web.json_response(
            {"choices": [{"message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}], "model": "plain"}
        )

    async def main() -> float:
        async with (
            recording_server(answer) as (a, _, _),
            recording_server(answer) as (b, _, _),
            HTTPInterception() as proxy,
            aiohttp.ClientSession() as client,
            AsyncExitStack() as stack,
        ):
            stack.callback(held.set)
            model = OpenAIModel([a, b], timeout=0.3, retries=2, backoff=0)
            stack.push_async_callback(model.aclose)
            pool = model.pool
            clock = pool.clock = Clock()

            async def call(slot: Slot, text: str) -> int:
                auth = {"Authorization": f"Bearer {slot.model_secret}"}
                body = {"messages": [{"role": "user", "content": text}]}
                async with client.post(f"{slot.base_url}/v1/chat/completions", json=body, headers=auth) as resp:
                    return resp.status

            async def opened() -> tuple[RolloutSession, Slot]:
                session = RolloutSession(Trace(task=TraceTask(type="T")), model)
                return session, await stack.enter_async_context(proxy.serve(session))

            sessions = [await opened() for _ in range(4)]
            for _, slot in sessions:
                assert await call(slot, "What is 2+2?") == 200
            on = [pool.session_server(s.trace.id) for s, _ in sessions]
            assert on[0] is on[2] and on[1] is on[3] and on[0] is not on[1]  # two sessions on each
            server = on[0]
            assert server is not None
            victim, attacker = sessions[0], sessions[2]
            assert await call(attacker[1], "x" * (2 * HUGE)) == 504  # 3 timeouts there, 1 after it moved
            out_for = max(0.0, server.down_until - clock.now)
            assert out_for == 0.0, "one session's timeouts took the server out of rotation"
            assert pool.session_server(attacker[0].trace.id) is not server  # it moved, alone
            assert await call(victim[1], "What is 3+3?") == 200
            assert pool.session_server(victim[0].trace.id) is server  # the victim stayed
            return out_for

    out_for = run(main)
    report(
        "21§5 one rollout's timeouts",
        "3 upstream timeouts of one rollout (huge requests)",
        "server stays in rotation; the victim's session stays",
        "0 s out of rotation (was 10 s; 10 s once 2 sessions fail)",
        out_for,
    )
