"""Which routing keeps a fleet's prefix caches warm without leaving servers idle? (issue 33 §2)

A simulated fleet (``--servers`` SimulatedModelServers on 127.0.0.1, each with the capacity
model: batch steps, waiting queue, KV cache with prefix caching, lognormal answer lengths) and
``--rollouts`` multi-turn agent rollouts of ``--turns`` turns: each has its own system prompt
(``--system`` tokens), calls the model, waits in its tool (uniform 0 to ``--tool-wait``
seconds, seeded), appends the tool's result and calls again with the whole conversation. Calls
are routed by ``ServerPool`` (the routing ``OpenAIModel`` uses) with each policy in turn, the
calls in flight counted on the servers as ``OpenAIModel`` counts them; every policy starts from
fresh servers (cold caches). Per policy, from the servers' own ``/metrics`` (vLLM's names):

* hit rate: ``prefix_cache_hits_total / prefix_cache_queries_total``, in tokens;
* tokens/s: ``generation_tokens_total`` summed over the servers, over the run's wall time;
* spread: the busiest server's generated tokens over the mean (1.0: even);
* preemptions.

``--long-every 4`` cuts the answers of all but every 4th rollout short: rollouts of very
different lengths, which a placement made once (sticky) can leave gathered on one server.

    python benchmarks/bench_routing.py            # 4 servers, 64 rollouts x 6 turns (~2.5 min)
    python benchmarks/bench_routing.py --quick    # 2 servers, 12 rollouts x 4 turns

Wall time includes this machine's load: the 2 cores also run the servers and the clients, so
compare policies within one run. ``tests/serving/test_routing.py`` checks the same ordering on
the capacity model alone, deterministically.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from contextlib import AsyncExitStack
from typing import Any

import aiohttp

from rollout_ray._serving.affinity import Routing, ServerPool
from rollout_ray._simulated.config import CapacityConfig, SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer

POLICIES: tuple[Routing, ...] = ("affinity", "sticky", "least_loaded", "round_robin")


def metrics(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    return values


async def rollout(k: int, pool: ServerPool, client: aiohttp.ClientSession, args: argparse.Namespace) -> None:
    rng = random.Random(k)
    system = " ".join(f"r{k:03d}t{i:03d}"[:8] for i in range(args.system // 2))  # 2 tokens a word
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Task {k}: work it out with the tool."},
    ]
    cap = {} if args.long_every and k % args.long_every == 0 else {"max_tokens": args.short_tokens}
    for turn in range(args.turns):
        server = pool.pick(f"rollout-{k}")
        server.inflight += 1
        try:
            async with client.post(server.chat_url, json={"messages": messages, **cap}) as resp:
                body = await resp.json()
                assert resp.status == 200, body
        finally:
            server.inflight -= 1
        messages.append(body["choices"][0]["message"])
        await asyncio.sleep(rng.uniform(0, args.tool_wait))
        messages.append({"role": "user", "content": f"Tool result {k}.{turn}: {rng.randrange(10**6)}"})


async def run_policy(routing: Routing, args: argparse.Namespace) -> dict[str, float]:
    capacity = CapacityConfig(
        max_batch=args.batch,
        kv_blocks=args.kv_blocks,
        step_base=args.step_base,
        step_per_seq=args.step_per_seq,
        prefill_per_token=args.prefill_per_token,
        gen_median=args.gen_median,
        gen_sigma=args.gen_sigma,
    )
    config = SimulatedModelConfig(capacity=capacity, max_completion_tokens=args.max_tokens)
    async with AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(SimulatedModelServer(config)) for _ in range(args.servers)]
        client = await stack.enter_async_context(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=600))
        )
        pool = ServerPool([s.base_url or "" for s in servers], routing=routing)
        start = time.perf_counter()
        await asyncio.gather(*[rollout(k, pool, client, args) for k in range(args.rollouts)])
        wall = time.perf_counter() - start
        per_server = []
        for s in servers:
            async with client.get(f"{(s.base_url or '').removesuffix('/v1')}/metrics") as resp:
                per_server.append(metrics(await resp.text()))
    tokens = [m["vllm:generation_tokens_total"] for m in per_server]
    hits = sum(m["vllm:prefix_cache_hits_total"] for m in per_server)
    queries = sum(m["vllm:prefix_cache_queries_total"] for m in per_server)
    return {
        "hit rate": hits / queries,
        "tokens/s": sum(tokens) / wall,
        "spread": max(tokens) / (sum(tokens) / len(tokens)),
        "preemptions": sum(m["vllm:num_preemptions_total"] for m in per_server),
        "wall s": wall,
        "tokens": sum(tokens),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--system", type=int, default=512, help="system prompt tokens per rollout")
    parser.add_argument("--tool-wait", type=float, default=0.5, help="most seconds a tool takes")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--kv-blocks", type=int, default=1024)
    parser.add_argument("--step-base", type=float, default=0.01)
    parser.add_argument("--step-per-seq", type=float, default=0.0005)
    parser.add_argument("--prefill-per-token", type=float, default=0.0001)
    parser.add_argument("--gen-median", type=int, default=60)
    parser.add_argument("--gen-sigma", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument(
        "--long-every",
        type=int,
        default=0,
        help="every N-th rollout answers at full length, the others are cut to --short-tokens "
        "(0: all full): long rollouts that a placement can gather on one server",
    )
    parser.add_argument("--short-tokens", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="2 servers, 12 rollouts x 4 turns")
    args = parser.parse_args()
    if args.quick:
        args.servers, args.rollouts, args.turns = 2, 12, 4
    print(
        f"{args.servers} servers (batch {args.batch}, {args.kv_blocks} KV blocks), {args.rollouts} rollouts "
        f"x {args.turns} turns, system prompt {args.system} tokens, answers lognormal median {args.gen_median}"
        + (f", all but every {args.long_every}th cut to {args.short_tokens} tokens" if args.long_every else "")
    )
    print(f"{'routing':<14}{'hit rate':>10}{'tokens/s':>10}{'spread':>8}{'preempt':>9}{'wall s':>8}")
    for routing in POLICIES:
        r = asyncio.run(run_policy(routing, args))
        print(
            f"{routing:<14}{r['hit rate']:>10.1%}{r['tokens/s']:>10.0f}{r['spread']:>8.2f}"
            f"{r['preemptions']:>9.0f}{r['wall s']:>8.1f}"
        )


if __name__ == "__main__":
    main()
