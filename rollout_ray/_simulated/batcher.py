"""The capacity model on the engine's clock: one task per server steps its scheduler, and a
generation waits for its sequences to be done; the server's ``/metrics`` in vLLM's names.

One task, one timer per step for the whole batch (not one per token): 8 servers of 64
sequences cost 8 timers. The task sleeps each step's duration, then wakes the generations the
step finished. While the engine is frozen (``pause?mode=keep``) no step runs; an abort
(``Flight.aborted``) drops the generation's sequences and frees their blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from .config import CapacityConfig
from .engine_state import Engine, Flight
from .scheduler import Scheduler

__all__ = ["Batcher", "metrics_route", "metrics_text"]


class Batcher:
    """Runs a :class:`Scheduler` for one server."""

    def __init__(self, config: CapacityConfig, engine: Engine) -> None:
        self.scheduler = Scheduler(config)
        self._engine = engine
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def serve(self, flight: Flight, prompt: Sequence[int], completions: Sequence[Sequence[int]]) -> bool:
        """Generate ``completions`` (one sequence each) after ``prompt``; ``False``: aborted."""
        seqs = [self.scheduler.seq([*prompt, *c], len(prompt), flight.wake) for c in completions]
        for seq in seqs:
            self.scheduler.add(seq)
        self._work.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())
        try:
            while not all(s.finished for s in seqs):
                if flight.aborted:
                    return False
                await flight.woken()
            return True
        finally:
            for seq in seqs:
                if not seq.finished:
                    self.scheduler.cancel(seq)

    async def _loop(self) -> None:
        scheduler = self.scheduler
        while True:
            if not scheduler.busy:
                self._work.clear()
                await self._work.wait()
                continue
            if self._engine.frozen:  # paused with `keep`: the batch stands still until resumed
                await self._engine.admit()
                continue
            duration, done = scheduler.step()
            await asyncio.sleep(duration)
            for seq in done:
                if seq.on_done is not None:
                    seq.on_done()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def metrics_text(model: str, scheduler: Scheduler | None, running: int) -> str:
    """``/metrics`` in the Prometheus text format, with vLLM V1's names (0.10 and later:
    ``kv_cache_usage_perc``, counters in tokens with ``_total``). Without a capacity model:
    ``running`` generations in flight, nothing waiting, no cache."""
    labels = f'{{engine="0",model_name="{model}"}}'
    if scheduler is None:
        gauges = {"num_requests_running": running, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.0}
        counters = dict.fromkeys(
            ("prompt_tokens", "generation_tokens", "prefix_cache_queries", "prefix_cache_hits", "num_preemptions"), 0
        )
    else:
        c = scheduler.counters
        gauges = {
            "num_requests_running": len(scheduler.running),
            "num_requests_waiting": len(scheduler.waiting),
            "kv_cache_usage_perc": scheduler.usage,
        }
        counters = {
            "prompt_tokens": c.prompt_tokens,
            "generation_tokens": c.generation_tokens,
            "prefix_cache_queries": c.prefix_cache_queries,
            "prefix_cache_hits": c.prefix_cache_hits,
            "num_preemptions": c.preemptions,
        }
    lines = []
    for name, value in gauges.items():
        lines += [f"# TYPE vllm:{name} gauge", f"vllm:{name}{labels} {float(value)}"]
    for name, value in counters.items():
        lines += [f"# TYPE vllm:{name} counter", f"vllm:{name}_total{labels} {float(value)}"]
    return "\n".join(lines) + "\n"


def metrics_route(
    model: str, engine: Engine, batcher: Batcher | None
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The ``GET /metrics`` handler of a server."""

    async def metrics(request: web.Request) -> web.Response:
        text = metrics_text(model, batcher.scheduler if batcher is not None else None, len(engine.flights))
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    return metrics
