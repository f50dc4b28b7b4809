"""The policy gate: the policy version and the weight-update pause, as one process sees them.

A trainer bumps the *policy version* after each weight update and *pauses* the model boundary
while the weights change. The driver owns both; each process where model calls are made or
agent time is charged holds one ``PolicyGate`` that the driver's executor keeps current
(``Executor.set_policy``): the driver's own process for a ``LocalExecutor`` (one per
executor), each rollout actor and, per rollout actor, its node's services on Ray.

* **The gate.** ``RolloutSession`` reads ``paused`` before every model call; while it is set
  the call waits here, *before* anything is sent upstream, and carries the version current
  when it leaves (``ModelCall.policy``, unless the server stamps its own). Calls already sent
  finish as they would. Not paused, a call costs two attribute reads: no await, no
  allocation.
* **The agent clock.** Paused time is not charged to a rollout's agent budget (B2, B24):
  every running segment's deadline (``SegmentClock``) stands still from the pause to the
  resume and then moves out by the pause's length, and the segment is charged its wall time
  less the time paused. This is the process's pause, not each call's wait: a program's calls
  wait in another process (its node's proxy) than the one charging its segment, and both see
  the same pause. A segment doing only tool work during a pause is not charged for it either.

* **The interrupt.** A pause may *interrupt* the calls in flight (``set(..., interrupt=True)``,
  ``Driver.paused(interrupt=True)``): each call holds an ``Interrupt`` from ``watch()`` while it
  is upstream; interrupting fires them all. A model client that can stop its call at the
  server and continue it later *arms* its interrupt; when it fires, it stops the call, keeps
  what was sampled, and the session continues the call after the resume (``_core/generation``).
  ``until_stopped()`` returns once every armed call that was fired has stopped. A call whose
  client cannot do that (no token-in route) is not armed: it finishes as with
  ``interrupt=False``, said once per process in the log.

A pause has no bound of its own: the driver that paused resumes (``Driver.paused``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("rollout_ray")

STOP_TIMEOUT = 30.0
"""Seconds ``until_stopped`` waits for interrupted calls to stop at their servers."""


def _now() -> float:
    """Loop time (virtual under ``run_virtual``), like the deadlines it is compared with."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


class Interrupt:
    """One model call's interrupt while it is upstream (``PolicyGate.watch``)."""

    __slots__ = ("fired", "armed", "plain", "_event", "_gate")

    def __init__(self, gate: PolicyGate) -> None:
        self.fired = False
        """Whether an interrupting pause reached the call."""
        self.armed = False
        """Whether the call's client can stop and continue it (``arm``)."""
        self.plain = False
        """Whether the call went upstream on a route that cannot be continued (``cannot_continue``)."""
        self._event: asyncio.Event | None = None
        self._gate = gate

    def arm(self) -> None:
        """The client can stop this call at its server and continue it: an interrupting pause
        waits for it to stop (``PolicyGate.until_stopped``)."""
        self.armed = True

    def cannot_continue(self) -> None:
        """The client sends this call on a route it cannot stop and continue (no token in):
        an interrupt lets it finish, said once per process in the log."""
        self.plain = True
        if self.fired:
            self._gate.warn_plain(1)

    async def wait(self) -> None:
        """Return once the call is interrupted."""
        if not self.fired:
            if self._event is None:
                self._event = asyncio.Event()
            await self._event.wait()

    def fire(self) -> None:
        self.fired = True
        if self._event is not None:
            self._event.set()


class PolicyGate:
    """One process's policy version and pause: model calls wait at it while it is paused, and
    the agent clocks of running segments stand still."""

    __slots__ = (
        "version",
        "paused",
        "_gate",
        "_paused_since",
        "_paused_total",
        "_clocks",
        "_calls",
        "_stopped",
        "_warned",
    )

    def __init__(self) -> None:
        self.version: int | None = None
        """The version a model call records when its server stamps none (``None``: unset)."""
        self.paused = False
        """Whether model calls wait before going upstream."""
        self._gate: asyncio.Event | None = None
        self._paused_since = 0.0
        self._paused_total = 0.0
        self._clocks: set[SegmentClock] = set()
        self._calls: set[Interrupt] = set()
        self._stopped: asyncio.Event | None = None
        self._warned = False

    def state(self) -> tuple[int | None, bool]:
        """``(version, paused)``, as ``set`` takes them (what crosses to another process)."""
        return self.version, self.paused

    def set(self, version: int | None, paused: bool, interrupt: bool = False) -> None:
        """Make ``version`` current and pause or resume; idempotent. ``interrupt`` with
        ``paused``: interrupt every call in flight (see the module docstring)."""
        self.version = version
        if paused and not self.paused:
            self.paused = True
            self._paused_since = _now()
            for clock in self._clocks:
                clock.suspend()
        elif not paused and self.paused:
            self._paused_total += _now() - self._paused_since
            self.paused = False
            gate, self._gate = self._gate, None
            if gate is not None:
                gate.set()
            for clock in self._clocks:
                clock.restart()
        if paused and interrupt:
            self._interrupt()

    def _interrupt(self) -> None:
        plain = 0
        for call in self._calls:
            call.fire()
            plain += call.plain
        self.warn_plain(plain)

    def warn_plain(self, calls: int) -> None:
        """Say once that interrupted ``calls`` run to their end (a call still choosing its route
        when the interrupt fires is counted once it goes out on the plain one)."""
        if calls and not self._warned:
            self._warned = True
            log.warning(
                "interrupt: %d model calls in flight cannot be interrupted (their model client has no "
                "token-in route to continue them: a plain OpenAI-compatible server, or token capture "
                "off); they run to their end, as with interrupt=False",
                calls,
            )

    @contextmanager
    def watch(self) -> Iterator[Interrupt]:
        """An ``Interrupt`` for one model call, held from when it passed the gate until it
        returns: an interrupting pause in between fires it."""
        call = Interrupt(self)
        self._calls.add(call)
        try:
            yield call
        finally:
            self._calls.discard(call)
            if call.fired and call.armed and self._stopped is not None and not self._stopping():
                self._stopped.set()

    def _stopping(self) -> int:
        """Armed calls interrupted and not yet stopped."""
        return sum(1 for call in self._calls if call.fired and call.armed)

    async def until_stopped(self, timeout: float = STOP_TIMEOUT) -> bool:
        """Return once every interrupted call that can stop has stopped at its server (``True``),
        or after ``timeout`` seconds (``False``, logged)."""
        try:
            async with asyncio.timeout(timeout):
                while self._stopping():
                    self._stopped = asyncio.Event()
                    await self._stopped.wait()
        except TimeoutError:
            log.warning("interrupt: %d model calls did not stop within %gs", self._stopping(), timeout)
            return False
        finally:
            self._stopped = None
        return True

    async def wait(self) -> None:
        """Return once not paused (at once if not paused)."""
        while self.paused:
            if self._gate is None:
                self._gate = asyncio.Event()  # made in the waiter's loop, dropped on resume
            await self._gate.wait()

    def paused_seconds(self) -> float:
        """Seconds this gate has been paused so far, the running pause included."""
        if self.paused:
            return self._paused_total + (_now() - self._paused_since)
        return self._paused_total


_PROCESS_GATE = PolicyGate()


def process_gate() -> PolicyGate:
    """The gate of rollouts built without one (a rollout actor's: one per process)."""
    return _PROCESS_GATE


class SegmentClock:
    """A segment's agent deadline that stands still while ``policy`` is paused.

    ``async with clock.timeout():`` bounds the segment like ``asyncio.timeout_at(deadline)``,
    except that the deadline moves out by every pause that overlaps the segment; ``close()``
    after it (in a ``finally``) lets the policy forget the clock.

    Args:
        policy: whose pauses are not charged.
        budget: agent seconds left (``None``: no deadline; the clock still measures).
    """

    __slots__ = ("policy", "started", "_base", "_paused_before", "_timeout")

    def __init__(self, policy: PolicyGate, budget: float | None) -> None:
        self.policy = policy
        self.started = _now()
        self._base = None if budget is None else self.started + max(0.0, budget)
        self._paused_before = policy.paused_seconds()
        self._timeout: asyncio.Timeout | None = None

    def paused(self) -> float:
        """Seconds paused since the segment started."""
        return self.policy.paused_seconds() - self._paused_before

    @property
    def deadline(self) -> float | None:
        """The loop-time deadline: the budget's, moved out by the pauses so far."""
        return None if self._base is None else self._base + self.paused()

    def spent(self) -> float:
        """Agent seconds the segment is charged: its wall time less the time paused."""
        return max(0.0, _now() - self.started - self.paused())

    def expired(self) -> bool:
        deadline = self.deadline
        return deadline is not None and _now() >= deadline

    def timeout(self) -> asyncio.Timeout:
        """The segment's timeout (enter it at once), rescheduled by the policy's pauses."""
        self._timeout = asyncio.timeout_at(None if self.policy.paused else self._base)
        if self._base is not None:
            self.policy._clocks.add(self)
        return self._timeout

    def close(self) -> None:
        """The segment ended: its timeout is no longer rescheduled."""
        if self._timeout is not None:
            self.policy._clocks.discard(self)
            self._timeout = None

    def suspend(self) -> None:
        if self._timeout is not None:
            self._timeout.reschedule(None)

    def restart(self) -> None:
        if self._timeout is not None:
            self._timeout.reschedule(self.deadline)
