"""Steering: a live run's rollouts as the driver sees them, its status, and what an operator
may do to it (``rollout-ray ctl``; served by ``control``).

The driver runs every rollout through ``Steering.run``, which keeps one small entry per
sample in flight (its label ``<group id>#<sample>``, task, start) and can cancel or requeue
it. Where each rollout is (its phase, since when) is not sent by the hosts as it changes:
``status`` polls the executor's ``live`` report, every few seconds, and what no host reports
yet reads as ``queued``. A phase is *stalled* when a rollout has been in it longer than its
bound: a set time (``after``), else ``factor`` × the phase's own p99 over the rollouts
finished so far (at least ``minimum``), else, before ``MIN_OBSERVED`` of them finished,
``default``.

Cancel fails the sample's running attempt with ``RolloutCancelled`` (retried as a failure
is: ``retry_failed``); requeue drops the attempt and runs the sample again at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from .._errors import RolloutCancelled
from .._hosting.executor import Executor, failed_trace
from .._hosting.live import PHASES
from .._hosting.spec import RolloutSpec
from .._record.trace import Trace
from .._record.trace_parts import AgentSpan, TimeSpan
from .auto_in_flight import AutoInFlight
from .progress import Progress
from .slots import Slots

MIN_OBSERVED = 20
"""Durations of a phase seen before its own p99 sets its stall bound."""
KEPT = 2048
"""Durations kept per phase (the latest)."""


@dataclass(frozen=True)
class StallRule:
    """When a rollout counts as stalled in its phase (see the module docstring)."""

    factor: float = 3.0
    minimum: float = 30.0
    default: float = 600.0
    after: float | None = None

    def bound(self, durations: deque[float] | None) -> float:
        if self.after is not None:
            return self.after
        if durations is None or len(durations) < MIN_OBSERVED:
            return self.default
        ordered = sorted(durations)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return max(self.factor * p99, self.minimum)


@dataclass
class _Sample:
    label: str
    task: Any
    started: float
    runner: asyncio.Task[Any]
    order: Literal["cancel", "requeue"] | None = None
    attempts: int = 1


@dataclass
class _Durations:
    """How long each phase took in the rollouts finished so far (the stall bounds' p99)."""

    by_phase: dict[str, deque[float]] = field(default_factory=dict)
    model_errors: int = 0

    def observe(self, trace: Trace) -> None:
        timing = trace.timing
        spans: dict[str, TimeSpan | AgentSpan] = {"boot": timing.boot, "setup": timing.setup, "agent": timing.agent}
        for phase, span in spans.items():
            if span.start and span.end:
                self._add(phase, span.end - span.start)
        if timing.finalize.start and timing.scoring.end:
            self._add("scoring", timing.scoring.end - timing.finalize.start)
        for call in trace.calls:
            if call.time.start and call.time.end:
                self._add("model call", call.time.end - call.time.start)
            self.model_errors += call.error is not None

    def _add(self, phase: str, seconds: float) -> None:
        self.by_phase.setdefault(phase, deque(maxlen=KEPT)).append(seconds)


class Steering:
    """The rollouts a driver has in flight, its status, and the operator's commands.

    Args:
        inner: the executor the rollouts run on.
        progress: the driver's counters.
        slots: the driver's in-flight bound (``set max-in-flight``, ``pause``).
        auto: the controller of that bound, with ``max_in_flight="auto"``.
        stop: stops the run's admission; what is in flight finishes (``stop``).
        rule: the default stall rule.
    """

    def __init__(
        self,
        inner: Executor,
        progress: Progress,
        slots: Slots,
        stop: Callable[[], None],
        rule: StallRule | None = None,
        auto: AutoInFlight | None = None,
    ) -> None:
        self.inner, self.progress, self.slots, self._stop = inner, progress, slots, stop
        self.auto = auto
        """``max_in_flight="auto"``: the controller of ``slots`` (``set max-in-flight`` overrides it)."""
        self.rule = rule or StallRule()
        self.samples: dict[str, _Sample] = {}
        self.durations = _Durations()
        self.stopping = False
        self._ids: dict[str, str] = {}
        """Trace id → label, as the last live report named them."""

    async def run(self, spec: RolloutSpec) -> Trace:
        """Run ``spec`` on the inner executor, registered while it runs: an operator's ``cancel``
        makes it a failed trace, a ``requeue`` runs it again (the driver's attempts and the
        executor see one run)."""
        runner = asyncio.current_task()
        assert runner is not None
        sample = self.samples[spec.label] = _Sample(spec.label, spec.task.data.idx, time.time(), runner)
        try:
            while True:
                try:
                    trace = await self.inner.run(spec)
                except asyncio.CancelledError:
                    order, sample.order = sample.order, None
                    if order is None or runner.uncancel() > 0:
                        raise  # not the operator's (the run is being cancelled)
                    if order == "requeue":
                        sample.started, sample.attempts = time.time(), sample.attempts + 1
                        continue
                    trace = failed_trace(spec, RolloutCancelled("cancelled by the operator (rollout-ray ctl cancel)"))
                self.durations.observe(trace)
                return trace
        finally:
            del self.samples[spec.label]

    # -- commands ---------------------------------------------------------------------------

    def find(self, ref: str) -> _Sample | None:
        """The sample in flight that ``ref`` names: its label, or its rollout (trace) id."""
        return self.samples.get(ref) or self.samples.get(self._ids.get(ref, ""))

    def cancel(self, ref: str, order: Literal["cancel", "requeue"] = "cancel") -> bool:
        """Cancel (or requeue) the running attempt of ``ref``; ``False``: no such rollout in flight."""
        sample = self.find(ref)
        if sample is None or sample.order is not None:
            return sample is not None
        sample.order = order
        sample.runner.cancel()
        return True

    def stop(self) -> None:
        self.stopping = True
        self.slots.resume()  # a paused run must reach its stop
        self._stop()

    # -- status -----------------------------------------------------------------------------

    async def status(self, rule: StallRule | None = None) -> dict[str, Any]:
        """The run now: rollouts in flight by phase with their age, the stalled ones, the rate,
        the model servers (as the executor's hosts report them)."""
        rule = rule or self.rule
        live = await self.inner.live()
        now = time.time()
        where = {r["label"]: r for r in live["rollouts"] if r.get("label") in self.samples}
        self._ids = {r["id"]: label for label, r in where.items()}
        rollouts, by_phase = [], dict.fromkeys(PHASES, 0)
        bounds = {phase: rule.bound(self.durations.by_phase.get(phase)) for phase in PHASES}
        for label, sample in list(self.samples.items()):
            seen = where.get(label)
            phase, since = (seen["phase"], seen["since"]) if seen else ("queued", sample.started)
            age = max(0.0, now - since)
            by_phase[phase] = by_phase.get(phase, 0) + 1
            rollouts.append(
                {
                    "label": label,
                    "id": seen["id"] if seen else None,
                    "task": sample.task,
                    "phase": phase,
                    "age": age,
                    "running": max(0.0, now - sample.started),
                    "attempt": sample.attempts,
                    "stalled": age > bounds[phase],
                }
            )
        rollouts.sort(key=lambda r: -r["age"])
        return {
            "state": self._state(),
            "updated_at": now,
            "progress": self._progress(),
            "max_in_flight": self.slots.limit,
            "in_flight_target": self._target(),
            "phases": by_phase,
            "rollouts": rollouts,
            "stalled": sum(r["stalled"] for r in rollouts),
            "stall_bounds": bounds,
            "servers": _servers(live["servers"]),
            "model_call_errors": self.durations.model_errors,
        }

    def final(self) -> dict[str, Any]:
        """The status of a run that ended (nothing in flight; ``state`` is the caller's)."""
        return {
            "updated_at": time.time(),
            "progress": self._progress(),
            "max_in_flight": self.slots.limit,
            "phases": dict.fromkeys(PHASES, 0),
            "rollouts": [],
            "stalled": 0,
            "servers": [],
            "model_call_errors": self.durations.model_errors,
        }

    def set_max_in_flight(self, n: int | None) -> None:
        """``set max-in-flight N`` (``None``: ``auto``, back to the controller).

        Raises:
            ValueError: ``auto`` for a run not started with ``max_in_flight="auto"``.
        """
        if n is None:
            if self.auto is None:
                raise ValueError(
                    "this run was not started with max_in_flight='auto' (--max-in-flight auto): "
                    "there is no controller to give the bound back to; set a number"
                )
            self.auto.back_to_auto()
        elif self.auto is not None:
            self.auto.set_by_operator(n)
        else:
            self.slots.resize(n)

    def _target(self) -> dict[str, Any] | None:
        return None if self.auto is None else self.auto.status()

    def _state(self) -> str:
        if self.stopping:
            return "stopping"
        return "paused" if self.slots.paused else "running"

    def _progress(self) -> dict[str, Any]:
        p = self.progress
        return {
            "total": p.total,
            "done": p.done,
            "failed": p.failed,
            "in_flight": p.in_flight,
            "retried": p.retried,
            "skipped": p.skipped,
            "rate": p.rate,
        }


def _servers(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The hosts' reports of each model server, summed by URL."""
    merged: dict[str, dict[str, Any]] = {}
    for s in reports:
        m = merged.setdefault(s["url"], {"url": s["url"], "in_flight": 0, "failures": 0, "down": False})
        m["in_flight"] += s["in_flight"]
        m["failures"] = max(m["failures"], s["failures"])
        m["down"] = m["down"] or s["down"]
    return list(merged.values())
