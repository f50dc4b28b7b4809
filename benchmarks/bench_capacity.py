"""Is the simulated fleet's capacity model cheap enough? (issue 33 §1)

``--servers`` SimulatedModelServers in this process, each with the capacity model (batch
``--batch``, a step of ``--step`` seconds, answers of ``--tokens`` tokens), and one request per
sequence slot sent at once over HTTP. Prints the tokens generated, the engine steps, the wall
time against the model's own time (``tokens * step`` per server), and the CPU seconds this
process spent on everything: HTTP, planning the answers, the scheduling.

    python benchmarks/bench_capacity.py            # 8 servers x 64 sequences x 4,000 tokens (~1.5 min)
    python benchmarks/bench_capacity.py --quick    # 2 servers x 16 sequences x 500 tokens
"""

from __future__ import annotations

import argparse
import asyncio
import time
from contextlib import AsyncExitStack

import aiohttp

from rollout_ray._simulated.config import CapacityConfig, SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer


async def run(args: argparse.Namespace) -> None:
    capacity = CapacityConfig(
        max_batch=args.batch,
        kv_blocks=args.batch * (args.tokens // 16 + 8),
        step_base=args.step,
        step_per_seq=0.0,
        prefill_per_token=0.0,
        gen_median=args.tokens,
        gen_sigma=0.0,
    )
    config = SimulatedModelConfig(capacity=capacity, max_completion_tokens=2 * args.tokens)
    async with AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(SimulatedModelServer(config)) for _ in range(args.servers)]
        client = await stack.enter_async_context(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))

        async def one(server: SimulatedModelServer, i: int) -> None:
            async with client.post(
                f"{server.base_url}/chat/completions", json={"messages": [{"role": "user", "content": f"task {i}"}]}
            ) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()

        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*[one(s, i) for s in servers for i in range(args.batch)])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        counters = [s.batcher.scheduler.counters for s in servers if s.batcher is not None]
    tokens, steps = sum(c.generation_tokens for c in counters), sum(c.steps for c in counters)
    print(
        f"{args.servers} servers x {args.batch} sequences x ~{args.tokens} tokens: {tokens:,} tokens in {steps:,} "
        f"steps; {wall:.1f} s wall for {args.tokens * args.step:.0f} s of model time a server; {cpu:.1f} CPU-s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--step", type=float, default=0.02, help="seconds of one decode step")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.servers, args.batch, args.tokens = 2, 16, 500
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
