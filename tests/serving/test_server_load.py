"""Routing on the servers' own load (``server_load.py``): their ``/metrics`` read by the pool,
so a server busy with another process's calls is seen as busy. Real simulated servers with
the capacity model on 127.0.0.1; the reader's clock is a fake."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from rollout_ray._serving.affinity import ServerPool
from rollout_ray._serving.server_load import LoadReader, parse_load
from rollout_ray._simulated.config import CapacityConfig, SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer

SGLANG = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified"} 5.0
sglang:num_queue_reqs{model_name="m",engine_type="unified"} 2.0
sglang:num_running_reqs_offline_batch{model_name="m"} 9.0
"""


def test_parse_load_sums_running_and_waiting_in_vllm_and_sglang_names() -> None:
    vllm = (
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 4.0\n'
        'vllm:num_requests_waiting_by_reason{reason="capacity"} 8.0\n'
    )
    assert parse_load(vllm) == 8
    assert parse_load(SGLANG) == 7
    assert parse_load("<html>not found</html>") is None


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_server_busy_with_another_processs_calls_loses_a_session_to_an_idle_one() -> None:
    # A step of an hour: the other process's calls stay running or waiting at `a`.
    held = SimulatedModelConfig(capacity=CapacityConfig(max_batch=2, step_base=3600.0))

    async def main() -> None:
        async with SimulatedModelServer(held) as a, SimulatedModelServer(held) as b, aiohttp.ClientSession() as client:
            assert a.base_url and b.base_url and a.batcher
            pool = ServerPool([a.base_url, b.base_url], balance=1.25)
            clock = Clock()
            reader = LoadReader(pool, interval=1.0, clock=clock)
            sa, sb = pool.servers
            sb.inflight = 1
            assert pool.pick("s") is sa
            sb.inflight = 0
            other = [
                asyncio.create_task(
                    client.post(
                        f"{a.base_url}/chat/completions", json={"messages": [{"role": "user", "content": f"q{i}"}]}
                    )
                )
                for i in range(3)
            ]
            async with asyncio.timeout(10):
                while len(a.batcher.scheduler.running) + len(a.batcher.scheduler.waiting) < 3:
                    await asyncio.sleep(0.005)
            assert pool.pick("s") is sa  # this pool sees nothing in flight anywhere
            await reader.refresh(client)
            assert (sa.reported, sb.reported) == (3, 0)  # 2 running, 1 waiting
            assert pool.pick("s") is sb  # a 4th at `a` would be past ceil(1.25 * 4 / 2) = 3
            for task in other:
                task.cancel()
            await asyncio.gather(*other, return_exceptions=True)

    asyncio.run(main())


def test_a_server_without_metrics_is_not_asked_again_and_reads_are_spaced() -> None:
    gets: list[str] = []

    async def missing(request: web.Request) -> web.Response:
        gets.append("missing")
        return web.Response(status=404)

    async def counting(request: web.Request) -> web.Response:
        gets.append("counting")
        return web.Response(text='vllm:num_requests_running{engine="0"} 2.0\n')

    async def main() -> None:
        runners = []
        for handler in (missing, counting):
            app = web.Application()
            app.router.add_get("/metrics", handler)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            runners.append(runner)
        try:
            async with aiohttp.ClientSession() as client:
                pool = ServerPool([f"http://127.0.0.1:{r.addresses[0][1]}/v1" for r in runners])
                clock = Clock()
                reader = LoadReader(pool, interval=1.0, clock=clock)
                await reader.refresh(client)
                plain, served = pool.servers
                assert sorted(gets) == ["counting", "missing"] and not plain.metrics and served.reported == 2
                clock.now += 0.5
                await reader.refresh(client)  # not stale yet: nothing is read
                assert len(gets) == 2
                clock.now += 1.0
                await reader.refresh(client)
                assert sorted(gets) == ["counting", "counting", "missing"]  # the 404 one is not asked again
        finally:
            for runner in runners:
                await runner.cleanup()

    asyncio.run(main())
