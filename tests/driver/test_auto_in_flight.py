"""``max_in_flight="auto"`` (issue 33 §3): the real Driver's bound follows the simulated fleet's
``/metrics`` (capacity model, served over loopback HTTP), an operator overrides it and gives it
back. The assertions are on the controller's
decisions given the metrics it read, never on wall time."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from typing import Any

from rollout_ray import ChatHarness
from rollout_ray._driver.auto_in_flight import START_PER_SERVER, parse_sample
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._driver.fleet_target import FleetSample
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.config import CapacityConfig, SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer

from conftest import tasks

VLLM = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.9
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
"""
SGLANG = 'sglang:num_running_reqs{tp_rank="0"} 4\nsglang:num_queue_reqs{tp_rank="0"} 1\nsglang:token_usage 0.5\n'


def test_a_servers_metrics_are_read_as_vllm_and_sglang_name_them() -> None:
    assert parse_sample(VLLM) == FleetSample(running=12, waiting=3, kv_usage=0.9, preemptions=2)
    assert parse_sample(SGLANG) == FleetSample(running=4, waiting=1, kv_usage=0.5, preemptions=0)
    assert parse_sample("# an exporter of something else\nhttp_requests_total 9\n") is None


async def _fleet(n: int, max_batch: int) -> list[SimulatedModelServer]:
    # Completions long enough (a step per token) that rollouts queue at a batch of max_batch.
    config = SimulatedModelConfig(
        capacity=CapacityConfig(max_batch=max_batch, step_base=0.002, gen_median=40, gen_sigma=0.0)
    )
    servers = [SimulatedModelServer(config) for _ in range(n)]
    for s in servers:
        await s.start()
    return servers


async def _waiting_at(servers: list[SimulatedModelServer], deadline: float = 10.0) -> None:
    """Until some server queues a request (bounded poll: the rollouts were started already)."""
    end = time.monotonic() + deadline
    while not any(s.batcher is not None and s.batcher.scheduler.waiting for s in servers):
        assert time.monotonic() < end, "no request queued at the servers within the deadline"
        await asyncio.sleep(0.005)


def test_the_driver_bound_follows_the_fleet_and_the_operator_overrides_it() -> None:
    async def main() -> None:
        servers = await _fleet(2, max_batch=1)
        model = OpenAIModel([s.base_url for s in servers], name="simulated", token_capture=None)
        try:
            async with LocalExecutor() as executor:
                driver = Driver(
                    tasks(60), ChatHarness(retries=0), model, executor=executor, config=EvalConfig(max_in_flight="auto")
                )
                auto = driver.in_flight
                assert auto is not None and auto.roots == [s.base_url.removesuffix("/v1") for s in servers]
                auto.interval = 3600.0  # the driver reads once, before any rollout; the test does the rest
                first = True
                async with aclosing(driver.groups()) as stream:
                    async for _ in stream:
                        if first:
                            first = False
                            # The driver's first sample, before any rollout: an idle fleet, but no rollout
                            # reached the bound yet, so it holds at its start.
                            idle, target, why = auto.decisions[0]
                            assert (idle.running, idle.waiting) == (0, 0)
                            assert why == "held: the servers have room but at most 0 of 32 were in flight"
                            assert target == 2 * START_PER_SERVER == driver._slots.limit
                            await _waiting_at(servers)
                            before = auto.target.target
                            sample = await auto.sample()
                            assert sample is not None and sample.waiting > max(1, 0.1 * sample.running)
                            assert auto.target.target == int(before * 0.9) == driver._slots.limit
                            assert auto.target.why == f"{sample.waiting} waiting at the servers"
                            # The operator's number holds through samples, until `auto` gives it back.
                            driver._steering.set_max_in_flight(3)
                            await auto.sample()
                            assert driver._slots.limit == 3 and auto.status()["mode"] == "operator"
                            status = await driver.live_status()
                            assert status["max_in_flight"] == 3
                            assert status["in_flight_target"]["why"].startswith("set by the operator")
                            driver._steering.set_max_in_flight(None)
                            assert driver._slots.limit == auto.target.target
                assert driver.progress.target == auto.target.target and driver.progress.target_why
        finally:
            await model.aclose()
            for s in servers:
                await s.stop()

    asyncio.run(main())


def test_a_fleet_without_metrics_keeps_the_starting_bound_and_says_why(caplog: Any) -> None:
    import socket

    from rollout_ray._driver.auto_in_flight import AutoInFlight
    from rollout_ray._driver.slots import Slots

    with socket.socket() as closed:  # a loopback port with no listener: nothing answers /metrics
        closed.bind(("127.0.0.1", 0))
        root = f"http://127.0.0.1:{closed.getsockname()[1]}"

    async def main() -> None:
        slots = Slots(16)
        auto = AutoInFlight(slots, [root])
        assert await auto.sample() is None
        await auto.run()  # returns at once: a fleet that never answered is not sampled again
        await auto.aclose()
        assert (auto.mode, slots.limit) == ("fixed", START_PER_SERVER)
        assert auto.status()["why"] == "no server serves vLLM's or SGLang's /metrics"
        nowhere = AutoInFlight(Slots(16), [])  # a model with no servers (scripted)
        assert nowhere.mode == "fixed" and "names no server" in nowhere.status()["why"]

    asyncio.run(main())
    assert "set max_in_flight=N to choose" in caplog.text


def test_the_auto_bound_composes_with_the_staleness_window_and_the_keep_rule() -> None:
    """Issue 33 §3 with issue 22's admission: the window (2 versions x 2 groups x 2 samples = 8
    rollouts) is below both the auto bound (32) and the fleet's batch (16), so the window is
    what holds rollouts back. The auto bound must not admit past it, the idle fleet must not
    push the bound up while the window holds (it would stand far above the fleet's saturation
    point when the trainer catches up), and an operator's number still wins. Every other group
    is refused by the keep rule: its replacement is admitted within the same window."""
    window_rollouts = 2 * 2 * 2
    verdicts: list[bool] = []

    def every_other(samples: Any) -> bool:
        verdicts.append(len(verdicts) % 2 == 0)
        return verdicts[-1]

    async def main() -> None:
        servers = await _fleet(2, max_batch=8)
        model = OpenAIModel([s.base_url for s in servers], name="simulated", token_capture=None)
        config = EvalConfig(
            max_in_flight="auto", samples_per_task=2, batch_groups=2, max_staleness=1, keep_group=every_other
        )
        peaks: list[int] = []
        try:
            async with LocalExecutor() as executor:
                driver = Driver(tasks(24), ChatHarness(retries=0), model, executor=executor, config=config)
                auto, slots, admission = driver.in_flight, driver._slots, driver._admission
                assert auto is not None and admission.window == 4
                auto.interval = 3600.0  # the driver samples once, before any rollout; the test does the rest

                async def sample() -> None:
                    peaks.append(slots.peak)  # the most in flight since the last sample
                    await auto.sample()

                streamed = 0
                async with aclosing(driver.groups()) as stream:
                    async for _ in stream:
                        streamed += 1
                        assert admission.open <= admission.window and slots.used <= window_rollouts
                        if streamed == 1:
                            start = auto.target.target
                            assert start == slots.limit == 2 * START_PER_SERVER > window_rollouts
                            for _ in range(3):
                                await sample()
                                assert auto.last is not None and auto.last.waiting == 0  # the fleet has room
                            # Held, not raised: the window, not the bound, kept rollouts back.
                            assert auto.target.target == start == slots.limit
                            assert auto.target.why.startswith("held: the servers have room but at most")
                        if streamed == 2:  # the operator's number wins over the samples, `auto` gives it back
                            driver._steering.set_max_in_flight(3)
                            await sample()
                            assert slots.limit == 3 and auto.status()["mode"] == "operator"
                        if streamed == 4:
                            await sample()
                            assert slots.limit == 3 and max(peaks[-1], slots.used) <= window_rollouts
                            driver._steering.set_max_in_flight(None)
                            assert slots.limit == auto.target.target == start
                peaks.append(slots.peak)  # since the last sample, to the end
                assert max(peaks) <= window_rollouts  # the auto bound never admitted past the window
                assert driver.progress.rejected == verdicts.count(False) >= 2
                assert streamed == verdicts.count(True) == 24 - driver.progress.rejected
        finally:
            await model.aclose()
            for s in servers:
                await s.stop()

    asyncio.run(main())
