"""The routing policies (``affinity.py``) against the simulated fleet's capacity model
(``_simulated/scheduler.py``): prefix-cache hit rate and time to finish, for multi-turn
rollouts. Deterministic: a discrete-event run on the engines' own clocks (``fleet``), no wall
time. The HTTP measurement is
``benchmarks/bench_routing.py``."""

from __future__ import annotations

import pytest

from rollout_ray._serving.affinity import Routing, Server, ServerPool
from rollout_ray._simulated.config import CapacityConfig
from rollout_ray._simulated.kv_cache import Seq
from rollout_ray._simulated.scheduler import Scheduler

SERVERS, SESSIONS, TURNS, KV_BLOCKS, SYSTEM = 4, 32, 6, 320, 512
CAPACITY = CapacityConfig(
    max_batch=4, kv_blocks=KV_BLOCKS, step_base=0.01, step_per_seq=0.0002, prefill_per_token=0.0001
)


def tool_wait(k: int, turn: int) -> float:
    """Seconds rollout ``k`` spends in its tool after ``turn``: spread over 0-0.5 s."""
    return ((k * 7919 + turn * 104729) % 101) / 200


def fleet(routing: Routing) -> tuple[float, float]:
    """Run 32 rollouts of 6 turns on 4 engines: (prefix-cache hit rate, generated tokens per
    second of the engines' clocks). Each rollout has its own 512-token system prompt; every
    4th answers 60 tokens a turn, the others 6 (the long tail that stickiness leaves on one
    engine), and a tool result of 8 tokens follows each answer after a tool wait.

    Each engine has its own clock, advanced by its steps' durations; the engine whose clock
    is earliest steps next, and a rollout calls again when its tool is done, so the run is a discrete-event simulation: the same numbers on any machine."""
    pool = ServerPool([f"http://{i}/v1" for i in range(SERVERS)], routing=routing)
    engines = {s.url: Scheduler(CAPACITY) for s in pool.servers}
    clock = dict.fromkeys(engines, 0.0)
    history = {k: [k * 1_000_000 + i for i in range(SYSTEM)] for k in range(SESSIONS)}
    turns = dict.fromkeys(history, 0)
    ready = dict.fromkeys(history, 0.0)  # rollout -> when it calls next
    calls: dict[Seq, tuple[int, Server]] = {}
    while ready or calls:
        busy = [u for u, e in engines.items() if e.busy]
        now = min([clock[u] for u in busy] + list(ready.values()))
        for k in sorted(k for k, t in ready.items() if t <= now):
            del ready[k]
            server = pool.pick(f"rollout-{k}")
            answer = [k * 1_000_000 + 500_000 + turns[k] * 100 + j for j in range(60 if k % 4 == 0 else 6)]
            engine = engines[server.url]
            if not engine.busy:
                clock[server.url] = max(clock[server.url], now)
            seq = engine.seq(history[k] + answer, len(history[k]))
            engine.add(seq)
            server.inflight += 1
            calls[seq] = (k, server)
        url = min((u for u, e in engines.items() if e.busy), key=clock.__getitem__)
        duration, done = engines[url].step()
        clock[url] += duration
        for seq in done:
            k, server = calls.pop(seq)
            server.inflight -= 1
            turns[k] += 1
            history[k] = [*seq.ids, *(k * 1_000_000 + 900_000 + turns[k] * 100 + j for j in range(8))]
            if turns[k] < TURNS:
                ready[k] = clock[url] + tool_wait(k, turns[k])
    hits = sum(e.counters.prefix_cache_hits for e in engines.values())
    queries = sum(e.counters.prefix_cache_queries for e in engines.values())
    tokens = sum(e.counters.generation_tokens for e in engines.values())
    return hits / queries, tokens / max(clock.values())


@pytest.fixture(scope="module")
def results() -> dict[str, tuple[float, float]]:
    return {routing: fleet(routing) for routing in ("affinity", "sticky", "least_loaded", "round_robin")}


def test_affinity_keeps_nearly_the_hit_rate_of_sticky_routing(results: dict[str, tuple[float, float]]) -> None:
    (affinity, _), (sticky, _) = results["affinity"], results["sticky"]
    assert affinity >= 0.8 * sticky
    for spread in ("least_loaded", "round_robin"):  # a turn rarely lands where its prefix is
        assert affinity > 1.5 * results[spread][0]


def test_affinity_generates_faster_than_every_other_policy(results: dict[str, tuple[float, float]]) -> None:
    # sticky leaves the long rollouts queued on one engine; spreading pays their prefills again
    for other in ("sticky", "least_loaded", "round_robin"):
        assert results["affinity"][1] > results[other][1]
