"""The simulated model's capacity model: batch steps, waiting queue, prefix cache, LRU,
preemption, the long tail of lengths, and ``/metrics`` in vLLM's names.

The scheduler has no clock: its behaviour is checked step by step, and its throughput from
the durations the steps report (deterministic, no wall time)."""

from __future__ import annotations

import asyncio
import math
import statistics
from typing import Any

import aiohttp
import pytest
from sim_client import run, until

from rollout_ray._simulated.completion import Draw, preamble_length
from rollout_ray._simulated.config import CapacityConfig, SimulatedModelConfig
from rollout_ray._simulated.kv_cache import Seq
from rollout_ray._simulated.model_server import SimulatedModelServer
from rollout_ray._simulated.scheduler import Scheduler
from rollout_ray._simulated.template import body as assistant_body
from rollout_ray._simulated.tokenizer import encode

BS = 16


def seq(s: Scheduler, tag: int, prompt: int, length: int) -> Seq:
    """A sequence whose ``prompt`` ids are its own (``tag``) unless another shares the tag."""
    return s.seq([tag * 100_000 + i for i in range(prompt)] + [7] * length, prompt)


def drain(s: Scheduler) -> tuple[float, int]:
    """Step until idle: (seconds, steps)."""
    seconds, steps = 0.0, 0
    while s.busy:
        seconds += s.step()[0]
        steps += 1
    return seconds, steps


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_one_step_per_batch_and_throughput_grows_with_the_batch_then_saturates(batch: int) -> None:
    cfg = CapacityConfig(max_batch=64, step_base=0.01, step_per_seq=0.0002, prefill_per_token=0.0)
    s = Scheduler(cfg)
    for i in range(batch):
        s.add(seq(s, i, 32, 100))
    seconds, steps = drain(s)
    assert steps == 100  # every sequence gets a token per step: one step for the whole batch
    assert s.counters.generation_tokens == 100 * batch
    assert seconds == pytest.approx(100 * (0.01 + 0.0002 * batch))
    # tokens/s = B / (base + per_seq * B): 99.0, 769.2, 2882.9 (bounded by 1 / per_seq = 5000)
    assert 100 * batch / seconds == pytest.approx(batch / (0.01 + 0.0002 * batch))


def test_beyond_max_batch_requests_wait_and_run_as_others_finish() -> None:
    s = Scheduler(CapacityConfig(max_batch=4, step_per_seq=0.0))
    for i in range(10):
        s.add(seq(s, i, 16, 5 if i < 4 else 50))
    s.step()
    assert (len(s.running), len(s.waiting)) == (4, 6)
    for _ in range(4):
        s.step()  # the first four finish at their 5th token
    assert (len(s.running), len(s.waiting)) == (0, 6)
    s.step()
    assert (len(s.running), len(s.waiting)) == (4, 2)


def test_prefill_is_paid_only_for_tokens_not_in_the_prefix_cache() -> None:
    cfg = CapacityConfig(step_base=0.0, step_per_seq=0.0, prefill_per_token=0.001)
    s = Scheduler(cfg)
    s.add(seq(s, 1, 100, 1))
    assert s.step()[0] == pytest.approx(0.100)  # 100 prompt tokens prefilled
    s.add(seq(s, 1, 100, 1))  # the same prompt: its 6 full blocks (96 tokens) are cached
    assert s.step()[0] == pytest.approx(0.004)
    assert (s.counters.prefix_cache_queries, s.counters.prefix_cache_hits) == (200, 96)
    # a next turn: the first turn's prompt, its answer and more: the prompt and answer blocks hit
    turn = s.seq([100_000 + i for i in range(100)] + [7, 8, 9] * 20 + [5], 160)
    first = s.seq([100_000 + i for i in range(100)] + [7, 8, 9] * 4, 100)
    s.add(first)
    drain(s)
    hits = s.counters.prefix_cache_hits
    s.add(turn)
    s.step()
    assert s.counters.prefix_cache_hits - hits == 112 // BS * BS  # 100 prompt + 12 answer tokens: 7 blocks


def test_cached_blocks_are_evicted_least_recently_used_first() -> None:
    # 12 blocks: a 48-token prompt is 3 full blocks, and its next token needs a 4th
    s = Scheduler(CapacityConfig(kv_blocks=12))

    def hits(tag: int) -> int:
        before = s.counters.prefix_cache_hits
        s.add(seq(s, tag, 48, 1))
        drain(s)
        return s.counters.prefix_cache_hits - before

    assert [hits(tag) for tag in (1, 2, 3)] == [0, 0, 0]  # 9 blocks cached, 3 free
    assert hits(1) == 48  # 1 used again: now 2 is the least recently used
    assert hits(4) == 0  # needs 4 blocks, 3 free: evicts one of 2's, its last block first
    assert hits(1) == 48
    assert hits(2) == 32  # 2 lost its last block, not its first two


def test_a_full_kv_cache_preempts_the_latest_sequence_which_is_recomputed_later() -> None:
    # 16 blocks of 16: two sequences of 16 + 150 tokens need 11 blocks each at the end
    s = Scheduler(CapacityConfig(kv_blocks=16, step_per_seq=0.0, step_base=0.0, prefill_per_token=1.0))
    a, b = seq(s, 1, 16, 150), seq(s, 2, 16, 150)
    s.add(a)
    s.add(b)
    seen_waiting = False
    while s.busy:
        s.step()
        seen_waiting |= b in s.waiting
        assert s.kv.used <= 16
    assert seen_waiting and s.counters.preemptions >= 1
    assert a.finished and b.finished
    assert s.counters.generation_tokens == 300  # recomputed tokens are prefill, not generation
    assert s.counters.prompt_tokens > 32  # b's tokens so far were prefilled again


def test_a_sequence_larger_than_the_whole_cache_is_refused_with_what_to_do() -> None:
    s = Scheduler(CapacityConfig(kv_blocks=2))
    with pytest.raises(ValueError, match="raise `kv_blocks`"):
        s.add(seq(s, 1, 40, 1))


def test_generation_lengths_are_lognormal_around_the_median() -> None:
    cfg = SimulatedModelConfig(capacity=CapacityConfig(gen_median=400, gen_sigma=1.0))
    lengths = [preamble_length(cfg, Draw(b"c", i.to_bytes(28, "big")), 0) for i in range(4000)]
    logs = [math.log(n) for n in lengths]
    assert statistics.median(lengths) == pytest.approx(400, rel=0.08)
    assert statistics.stdev(logs) == pytest.approx(1.0, rel=0.08)
    assert max(lengths) > 10 * 400  # the long tail
    flat = SimulatedModelConfig(capacity=CapacityConfig(gen_median=400, gen_sigma=0.0))
    assert {preamble_length(flat, Draw(b"c", i.to_bytes(28, "big")), 0) for i in range(50)} == {400}


def _metrics(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    return values


def test_the_server_batches_caches_and_reports_in_vllms_metric_names() -> None:
    capacity = CapacityConfig(max_batch=2, gen_median=40, gen_sigma=0.0, step_base=0.001, step_per_seq=0.0)
    system = {"role": "system", "content": "You are a careful agent. " * 20}

    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        async def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
            async with session.post(f"{root}/v1/chat/completions", json={"messages": messages}) as resp:
                assert resp.status == 200
                return await resp.json()

        # five rollouts' first turns at once: two run, three wait
        firsts = await asyncio.gather(*[chat([system, {"role": "user", "content": f"task {i}"}]) for i in range(5)])
        async with session.get(f"{root}/metrics") as resp:
            assert resp.status == 200 and resp.content_type == "text/plain"
            m = _metrics(await resp.text())
        assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
        # each answer's tokens as the chat template renders it, and its end token
        answers = [f["choices"][0]["message"] for f in firsts]
        assert m["vllm:generation_tokens_total"] == sum(len(encode(assistant_body(a))) + 1 for a in answers)
        queries, hits = m["vllm:prefix_cache_queries_total"], m["vllm:prefix_cache_hits_total"]
        assert hits > 0  # the shared system prompt
        # a second turn: its prompt is the first turn's and its answer, found in the cache
        first = firsts[0]["choices"][0]["message"]
        await chat([system, {"role": "user", "content": "task 0"}, first, {"role": "user", "content": "go on"}])
        async with session.get(f"{root}/metrics") as resp:
            m2 = _metrics(await resp.text())
        turn_queries = m2["vllm:prefix_cache_queries_total"] - queries
        assert (m2["vllm:prefix_cache_hits_total"] - hits) / turn_queries > 0.8
        assert set(m2) >= {"vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total", "vllm:num_preemptions_total"}
        assert len(firsts[0]["choices"][0]["message"]["content"]) >= 40 * 4  # a 40-word preamble

    run(body, capacity=capacity)


def test_metrics_without_the_capacity_model_report_requests_in_flight() -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        async with session.get(f"{root}/metrics") as resp:
            m = _metrics(await resp.text())
        assert m["vllm:num_requests_running"] == 0 and m["vllm:generation_tokens_total"] == 0

    run(body)


def test_token_capture_goes_through_the_batch_and_an_abort_frees_the_sequence() -> None:
    capacity = CapacityConfig(max_batch=1, gen_median=30, gen_sigma=0.0, step_base=0.0, step_per_seq=0.0)
    chat = {"messages": [{"role": "user", "content": "What is 17 + 25?"}], "return_token_ids": True, "logprobs": True}

    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        url = f"{root}/v1/chat/completions"
        async with session.post(url, json=chat) as resp:
            (choice,) = (await resp.json())["choices"]
        assert choice["finish_reason"] == "stop"
        assert len(choice["token_ids"]) == server.batcher.scheduler.counters.generation_tokens > 30
        # a step that never ends holds the next request in the batch: the abort must free it
        server.batcher.scheduler.config = capacity.model_copy(update={"step_base": 3600.0})
        held = asyncio.create_task(session.post(url, json={**chat, "request_id": "a1"}))
        await until(lambda: server.batcher.scheduler.running)
        async with session.post(f"{root}/abort_requests", json={"request_ids": ["chatcmpl-a1"]}) as resp:
            assert (await resp.json())["aborted"] == 1
        async with await held as resp:
            (choice,) = (await resp.json())["choices"]
        assert choice["finish_reason"] == "abort" and choice["token_ids"] == []
        assert not server.batcher.scheduler.busy and server.batcher.scheduler.kv.used == 0

    run(body, capacity=capacity)
