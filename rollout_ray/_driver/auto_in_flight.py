"""``max_in_flight="auto"``: the driver's in-flight bound follows the model servers' ``/metrics``.

Every ``interval`` seconds the servers of the run's model (``fleet_roots``: the URLs the
model was configured with) are read; their requests running and waiting, KV-cache usage and
preemptions, summed over the fleet (the fullest server's KV usage), move ``FleetTarget``
(``fleet_target.py``: additive increase while nothing waits and the bound was reached,
multiplicative decrease when the queue grows or the cache preempts), and the driver's ``Slots``
are resized to it. A lowered
bound never cancels a rollout: those in flight finish (``slots``).

It only bounds rollouts; the staleness window and ``max_groups`` still bound groups
(``admission``), so a trainer that lags holds admission back whatever the target says, and a
rejected group's replacement needs a slot as any other. While admission (or anything else)
keeps fewer rollouts in flight than the target, the target is held, not raised: the most in
flight since the last sample (``Slots.peak``) is what the controller is told.

An operator's ``rollout-ray ctl RUN set max-in-flight N`` takes the bound from the controller
(it is still sampled, so ``status`` shows what it would do); ``set max-in-flight auto`` gives
it back. A fleet none of whose servers serves vLLM's or SGLang's metrics keeps the starting
bound, and the run says so once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

import aiohttp

from .._core.model import Model
from .fleet_target import FleetSample, FleetTarget
from .slots import Slots

__all__ = ["AutoInFlight", "fleet_roots", "parse_sample"]

log = logging.getLogger("rollout_ray")

START_PER_SERVER = 16
"""The starting bound per server, before the first sample: below any server's batch, so the
first samples see room and raise it."""
STEP_PER_SERVER = 4
"""The additive increase per sample, per server: a fleet of ``n`` servers fills ``n`` batches."""

_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
_PREEMPTED = ("vllm:num_preemptions_total", "vllm:num_preemptions")


def parse_sample(text: str) -> FleetSample | None:
    """One server's load in a Prometheus text exposition (label sets summed; KV usage: the
    largest); ``None``: neither vLLM's nor SGLang's running count is there."""
    running = waiting = preempted = 0.0
    kv, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(("vllm:", "sglang:")):
            continue
        name, _, raw = line.rpartition(" ")
        name = name.split("{", 1)[0]
        try:
            value = float(raw)
        except ValueError:
            continue
        if name in _RUNNING:
            running, found = running + value, True
        elif name in _WAITING:
            waiting += value
        elif name in _KV:
            kv = max(kv, value)
        elif name in _PREEMPTED:
            preempted += value
    return FleetSample(round(running), round(waiting), kv, round(preempted)) if found else None


def fleet_roots(model: Model) -> list[str]:
    """The roots (where ``/metrics`` is) of the servers ``model`` was configured with; ``[]``:
    a model without servers (scripted, in process)."""
    pool = getattr(model, "pool", None)  # OpenAIModel's ServerPool (the driver does not import _serving)
    return [s.root for s in getattr(pool, "servers", [])]


class AutoInFlight:
    """Keeps ``slots.limit`` at the fleet's target (``run``), unless an operator set it.

    Args:
        slots: the driver's in-flight bound.
        roots: the servers' roots (``fleet_roots``).
        interval: seconds between two samples.
        timeout: seconds one server's ``/metrics`` may take (a slow one is left out of that sample).
    """

    def __init__(self, slots: Slots, roots: list[str], *, interval: float = 0.5, timeout: float = 0.5) -> None:
        n = max(1, len(roots))
        self.slots, self.roots, self.interval, self.timeout = slots, roots, interval, timeout
        self.target = FleetTarget(START_PER_SERVER * n, step=STEP_PER_SERVER * n)
        self.mode: Literal["auto", "operator", "fixed"] = "auto" if roots else "fixed"
        self.last: FleetSample | None = None
        self.decisions: list[tuple[FleetSample, int, str]] = []
        """Every sample with the target it led to and why (the last ``KEPT``)."""
        self._session: aiohttp.ClientSession | None = None
        slots.resize(self.target.target)
        if not roots:
            self.target.why = "the model names no server to read /metrics from"
            log.warning(
                "max_in_flight='auto': the model names no server to read /metrics from; running at most "
                "%d rollouts at once (set max_in_flight=N to choose)",
                self.target.target,
            )

    @staticmethod
    def start(limit: int | Literal["auto"]) -> int:
        """The ``Slots`` limit a driver starts with for ``EvalConfig.max_in_flight``."""
        return limit if isinstance(limit, int) else START_PER_SERVER

    async def run(self) -> None:
        """Sample every ``interval`` seconds until cancelled (the driver takes the first sample
        itself, before any rollout starts; a fleet without metrics is not sampled again)."""
        while self.mode != "fixed":
            await asyncio.sleep(self.interval)
            await self.sample()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def sample(self) -> FleetSample | None:
        """Read the fleet now and move the target (and, unless an operator set it, the bound)."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        reads = await asyncio.gather(*[self._read(root) for root in self.roots])
        samples = [s for s in reads if s is not None]
        if not samples:
            if self.last is None and self.mode == "auto":  # never read: not a vLLM / SGLang fleet
                self.mode, self.target.why = "fixed", "no server serves vLLM's or SGLang's /metrics"
                log.warning(
                    "max_in_flight='auto': none of %s serves vLLM's or SGLang's /metrics; running at "
                    "most %d rollouts at once (set max_in_flight=N to choose)",
                    self.roots,
                    self.slots.limit,
                )
            return None
        fleet = FleetSample(
            sum(s.running for s in samples),
            sum(s.waiting for s in samples),
            max(s.kv_usage for s in samples),
            sum(s.preemptions for s in samples),
        )
        used, self.slots.peak = self.slots.peak, self.slots.used  # since the last sample
        target = self.target.update(fleet, used)
        self.last = fleet
        self.decisions = [*self.decisions[-(KEPT - 1) :], (fleet, target, self.target.why)]
        if self.mode == "auto":
            self.slots.resize(target)
        return fleet

    async def _read(self, root: str) -> FleetSample | None:
        assert self._session is not None
        try:
            async with self._session.get(f"{root}/metrics", timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
                return parse_sample(await r.text()) if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None  # down or slow now: the others' sample stands

    # -- the operator ------------------------------------------------------------------------

    def set_by_operator(self, n: int) -> None:
        """``ctl set max-in-flight N``: the bound is ``N`` until ``back_to_auto``."""
        self.mode = "operator"
        self.slots.resize(n)

    def back_to_auto(self) -> None:
        """``ctl set max-in-flight auto``: the controller's target is the bound again."""
        self.mode = "auto"
        self.slots.resize(self.target.target)

    def status(self) -> dict[str, Any]:
        """For ``ctl status`` and the progress line: who sets the bound, the target, why."""
        why = self.target.why if self.mode != "operator" else f"set by the operator (auto: {self.target.why})"
        last = self.last
        return {
            "mode": self.mode,
            "target": self.target.target,
            "why": why,
            "fleet": None
            if last is None
            else {
                "running": last.running,
                "waiting": last.waiting,
                "kv_usage": last.kv_usage,
                "preemptions": last.preemptions,
            },
        }


KEPT = 256
"""Decisions kept for inspection (tests, benchmarks)."""
