"""The capacity model's scheduler: vLLM's continuous batching, one decode step at a time.

Each step (:meth:`Scheduler.step`), as vLLM V1's scheduler: every running sequence gets room
for its next token, and when the KV cache has none the most recently admitted sequence is
preempted (its blocks freed, back at the head of the queue, recomputed when admitted again);
then, if nothing was preempted, waiting sequences are admitted while the batch has room
(``max_batch``) and the cache has blocks, each paying a prefill for its tokens not found in the
prefix cache; then every sequence of the batch produces one token. The step lasts
``step_base + step_per_seq * batch + prefill_per_token * prefilled``: throughput grows with the
batch and saturates. The scheduler is plain state, no clock: :class:`~.batcher.Batcher` runs
it on the engine's clock, and tests run it step by step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .config import CapacityConfig
from .kv_cache import KVCache, Seq

__all__ = ["Counters", "Scheduler"]


@dataclass
class Counters:
    """vLLM's counters (``/metrics``): tokens, in tokens, as vLLM counts them."""

    prompt_tokens: int = 0
    """Prompt tokens computed (prefilled), cache hits not included."""
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    """Tokens looked up in the prefix cache (each admission's computed tokens)."""
    prefix_cache_hits: int = 0
    """Of those, the tokens found."""
    preemptions: int = 0
    steps: int = 0
    busy_seconds: float = 0.0
    """Sum of the steps' durations."""


class Scheduler:
    """The running batch, the waiting queue and the KV cache of one simulated engine."""

    def __init__(self, config: CapacityConfig) -> None:
        self.config = config
        self.kv = KVCache(config.kv_blocks, config.block_size)
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.counters = Counters()

    def seq(self, ids: Sequence[int], prompt: int, on_done: Callable[[], None] | None = None) -> Seq:
        """A sequence of this engine's block size (``on_done``: called when it finishes)."""
        return Seq(ids, prompt, self.config.block_size, on_done)

    def add(self, seq: Seq) -> None:
        """Queue ``seq``. One too long for the whole cache could never run: refused."""
        if -(-(len(seq.ids) + 1) // self.config.block_size) > self.config.kv_blocks:
            raise ValueError(
                f"a sequence of {len(seq.ids)} tokens does not fit the KV cache of "
                f"{self.config.kv_blocks} blocks of {self.config.block_size}: raise `kv_blocks`"
            )
        if seq.finished:
            return
        self.waiting.append(seq)

    def cancel(self, seq: Seq) -> None:
        """Drop ``seq`` (aborted), freeing its blocks."""
        if seq in self.running:
            self.running.remove(seq)
            self.kv.release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def usage(self) -> float:
        """The fraction of KV blocks held by sequences (vLLM's ``kv_cache_usage_perc``)."""
        return self.kv.used / self.kv.blocks

    def step(self) -> tuple[float, list[Seq]]:
        """One engine step: its duration in seconds (0 when idle) and the sequences it finished."""
        preempted = self._make_room()
        prefilled = 0 if preempted else self._admit()
        if not self.running:
            return 0.0, []
        done = []
        for seq in self.running:
            self.kv.produced(seq)
            if seq.finished:
                done.append(seq)
        for seq in done:
            self.running.remove(seq)
            self.kv.release(seq)
        c, cfg = self.counters, self.config
        c.generation_tokens += len(self.running) + len(done)
        duration = (
            cfg.step_base + cfg.step_per_seq * (len(self.running) + len(done)) + cfg.prefill_per_token * prefilled
        )
        c.steps += 1
        c.busy_seconds += duration
        return duration, done

    def _make_room(self) -> bool:
        """Room for each running sequence's next token, preempting from the batch's end."""
        preempted = False
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            if self.kv.grow(seq):
                i += 1
                continue
            victim = self.running.pop()
            self.kv.release(victim)
            self.waiting.appendleft(victim)
            self.counters.preemptions += 1
            preempted = True
        return preempted

    def _admit(self) -> int:
        """Admit waiting sequences while there is room; the tokens they prefill."""
        prefilled = 0
        while self.waiting and len(self.running) < self.config.max_batch:
            seq = self.waiting[0]
            hits = self.kv.admit(seq)
            if hits is None:
                break
            self.waiting.popleft()
            self.running.append(seq)
            self.counters.prefix_cache_queries += seq.computed
            self.counters.prefix_cache_hits += hits
            self.counters.prompt_tokens += seq.computed - hits
            prefilled += seq.computed - hits
        return prefilled
