"""Routing and ``max_in_flight="auto"`` on two real vLLM servers (issue 33 §2-3), reading the
servers' own ``/metrics``: the load routing weighs is ``vllm:num_requests_running`` and
``vllm:num_requests_waiting``, and the in-flight target moves with what the servers say.

Two servers of the tiny model (``vllm_server.serve_many``: ~3 GB each, started together),
each with a batch of 8 (``--max-num-seqs 8``), so a ninth request waits. Long generations
(``ignore_eos``) hold a server busy while a test reads it; every wait is a bounded poll of
``/metrics``, and the assertions are on what was read and decided, never on wall time.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from vllm_server import NAME, Server, get, model_dir, serve_many, vllm_python

from rollout_ray import (
    ChatHarness,
    Driver,
    EvalConfig,
    LocalExecutor,
    LocalRuntime,
    OpenAIModel,
    Rollout,
    Task,
    Trace,
    reward,
)
from rollout_ray._driver.auto_in_flight import START_PER_SERVER, STEP_PER_SERVER, parse_sample
from rollout_ray._driver.fleet_target import FleetTarget
from rollout_ray._serving.affinity import ServerPool
from rollout_ray._serving.server_load import LoadReader, parse_load

pytestmark = [pytest.mark.real_server, pytest.mark.timeout(900)]

BATCH = 8
"""``--max-num-seqs`` of each server (``vllm_server``)."""
HOLD = {"max_tokens": 1500, "ignore_eos": True, "temperature": 1.0, "seed": 5}
"""A generation that lasts seconds on 2 cores: it holds its place in a batch while a test reads."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    python = vllm_python()
    tmp = tmp_path_factory.mktemp("vllm-fleet")
    with serve_many(2, python, model_dir(python, tmp), tmp) as servers:
        yield servers


def metrics(server: Server) -> str:
    status, body = get(server.root + "/metrics")
    assert status == 200, status
    return body.decode()


def gauge(text: str, name: str) -> float:
    """A vLLM metric summed over its label sets."""
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


async def until(condition: Any, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds:g}s"
        await asyncio.sleep(0.05)


class Ask(Task):
    @reward
    def replied(self, trace: Trace) -> float:
        return float(bool(trace.last_reply))


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_routing_reads_vllms_running_and_waiting_and_moves_sessions_off_a_busy_server(fleet: list[Server]) -> None:
    """Another client's three long generations run at ``a``: its ``/metrics`` says so in vLLM's
    names, the pool reads it (what this process has in flight says nothing), a session on
    ``a`` moves to ``b`` (a fourth call at ``a`` would pass the bounded load), and rollouts
    through ``OpenAIModel`` land on ``b``."""
    a, b = fleet
    held = 3

    async def main() -> None:
        async with aiohttp.ClientSession() as client:
            body = {"model": NAME, "messages": [{"role": "user", "content": "Count."}], "stream": True, **HOLD}
            others = [await client.post(a.base_url + "/chat/completions", json=body) for _ in range(held)]
            try:
                await until(lambda: gauge(metrics(a), "vllm:num_requests_running") == held)
                text = metrics(a)
                assert parse_load(text) == held and parse_load(metrics(b)) == 0
                sample = parse_sample(text)
                assert sample is not None and (sample.running, sample.waiting) == (held, 0)
                assert 0.0 < sample.kv_usage < 1.0, sample  # vllm:kv_cache_usage_perc, three sequences' blocks

                pool = ServerPool([a.base_url, b.base_url], balance=1.25)
                sa, sb = pool.servers
                sb.inflight = 1
                assert pool.pick("s") is sa  # the session starts on a
                sb.inflight = 0
                assert pool.pick("s") is sa  # this pool sees nothing in flight anywhere
                await LoadReader(pool, clock=Clock()).refresh(client)
                assert (sa.reported, sb.reported) == (held, 0)
                assert pool.pick("s") is sb  # a 4th at a would pass ceil(1.25 * 4 / 2) = 3

                done_a, done_b = (gauge(metrics(s), "vllm:request_success_total") for s in (a, b))
                model = OpenAIModel([a.base_url, b.base_url], name=NAME, token_capture="vllm")
                try:
                    for i in range(2):
                        rollout = Rollout(
                            Ask({"prompt": f"What is {i} + {i}?"}),
                            ChatHarness(retries=0),
                            model=model,
                            runtime_factory=LocalRuntime,
                            sampling={"max_tokens": 8, "seed": i},
                        )
                        trace = await rollout.run()
                        assert trace.ok, trace.errors
                finally:
                    await model.aclose()
                assert gauge(metrics(b), "vllm:request_success_total") == done_b + 2
                assert gauge(metrics(a), "vllm:request_success_total") == done_a
            finally:
                for resp in others:  # closing the stream aborts the generation at the server
                    resp.close()
            await until(lambda: gauge(metrics(a), "vllm:num_requests_running") == 0)

    asyncio.run(main())


def test_auto_in_flight_follows_the_fleets_metrics(fleet: list[Server]) -> None:
    """A short eval run with ``max_in_flight="auto"``: the driver's first sample reads an idle
    fleet and raises the bound; once more rollouts run than the two batches hold, the servers'
    queue (``vllm:num_requests_waiting``) lowers it. The recorded decisions are the
    controller's rule applied to what was read, and the bound the driver ran at is the target."""
    n = 2 * BATCH + 8
    tasks = [Ask({"idx": i, "prompt": f"Count to {100 + i}."}) for i in range(n)]
    config = EvalConfig(max_in_flight="auto", sampling={**HOLD, "max_tokens": 400})

    async def main() -> None:
        model = OpenAIModel([s.base_url for s in fleet], name=NAME, token_capture="vllm")
        try:
            async with LocalExecutor(runtime="local") as executor:
                driver = Driver(tasks, ChatHarness(retries=0), model, executor=executor, config=config)
                auto = driver.in_flight
                assert auto is not None and auto.roots == [s.root for s in fleet]
                auto.interval = 3600.0  # the driver samples once before any rollout; the test does the rest
                running = asyncio.ensure_future(driver.arun())
                await until(lambda: sum(gauge(metrics(s), "vllm:num_requests_waiting") for s in fleet) > 1)
                before = auto.target.target
                sample = await auto.sample()
                assert sample is not None and sample.running <= 2 * BATCH and sample.waiting > 1
                assert auto.target.target == int(before * 0.9) == driver._slots.limit
                status = auto.status()
                assert status["why"] == f"{sample.waiting} waiting at the servers" and status["mode"] == "auto"
                assert status["fleet"]["running"] == sample.running
                result = await asyncio.wait_for(running, 600)
        finally:
            await model.aclose()
        assert result.samples["ok"].to_pylist() == [True] * n
        (idle, first, why), (_, second, _) = auto.decisions
        assert (idle.running, idle.waiting, why) == (0, 0, "servers have room")
        assert first == 2 * (START_PER_SERVER + STEP_PER_SERVER) and second == int(first * 0.9)
        replay = FleetTarget(2 * START_PER_SERVER, step=2 * STEP_PER_SERVER)
        assert [(replay.update(s), replay.why) for s, *_ in auto.decisions] == [(t, w) for _, t, w in auto.decisions]
        assert driver.progress.target == second and driver.progress.target_why == auto.target.why
        print(f"\nauto in-flight decisions: {auto.decisions}")

    asyncio.run(main())
