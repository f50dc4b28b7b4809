"""The simulated model's engine state: its policy version over time, pause, and the
generations in flight that an abort or a pause reaches.

Time is the engine's production clock: real time that stands still while the engine is paused
with ``keep`` (frozen). A generation's token ``j`` is produced when the clock has advanced
``ttft + (j + 1) * per_token`` since the generation was admitted, under the policy version of
that moment (:meth:`Engine.version_at`): a version set while a generation is frozen applies to
every token it produces after the resume, as vLLM's ``/pause?mode=keep`` then a weight reload
does.

Pause modes (vLLM's ``/pause?mode=``; SGLang's ``in_place`` and ``retract`` are ``keep``):
``abort`` aborts every generation in flight, ``keep`` freezes them, ``wait`` lets them finish
(:meth:`Engine.pause` returns when they have). In every mode, a new request is held until
:meth:`Engine.resume`.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Literal

__all__ = ["PAUSE_MODES", "Engine", "Flight", "PauseMode"]

PauseMode = Literal["abort", "keep", "wait"]
PAUSE_MODES: tuple[PauseMode, ...] = ("abort", "keep", "wait")


class Flight:
    """One request generating: woken whenever the engine changes (version, pause, abort)."""

    def __init__(self, rid: str, engine: Engine) -> None:
        self.rid = rid
        self.start = engine.clock()
        self.aborted = False
        """Stop producing: an abort, or a stream that can take no more (see ``cut``)."""
        self.cut = False
        """The stream was cut short on purpose (the malformed fault): not an abort."""
        self._engine = engine
        self._woken = asyncio.Event()

    def elapsed(self) -> float:
        """Production seconds since admission."""
        return self._engine.clock() - self.start

    def wake(self) -> None:
        self._woken.set()

    async def until(self, elapsed: float) -> None:
        """Sleep until ``elapsed`` production seconds have passed or the engine changes
        (callers check again). Frozen, the clock stands still: wait to be woken."""
        frozen = self._engine.frozen
        timeout = None if frozen else max(0.0, elapsed - self.elapsed())
        if self.aborted or timeout == 0.0:
            return
        with suppress(TimeoutError):
            await asyncio.wait_for(self._woken.wait(), timeout)
        self._woken.clear()

    async def woken(self) -> None:
        """Wait for a wake-up: the engine changed, or the capacity model finished a sequence
        of this generation (``batcher.py``)."""
        await self._woken.wait()
        self._woken.clear()

    async def spend(self, seconds: float) -> bool:
        """Spend ``seconds`` of production time (pauses excluded); ``False`` if aborted."""
        target = self.elapsed() + seconds
        while not self.aborted and self.elapsed() < target:
            await self.until(target)
        return not self.aborted


class Engine:
    """The running state behind the generation routes and the control routes."""

    def __init__(self, version: int) -> None:
        self._changes: list[tuple[float, int]] = [(float("-inf"), version)]
        self.paused: PauseMode | None = None
        self.flights: dict[str, Flight] = {}
        self._frozen_total = 0.0
        self._frozen_since: float | None = None
        self._running = asyncio.Event()
        self._running.set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def frozen(self) -> bool:
        return self._frozen_since is not None

    def clock(self) -> float:
        """The production clock (seconds): real time, standing still while frozen."""
        now = time.monotonic() if self._frozen_since is None else self._frozen_since
        return now - self._frozen_total

    @property
    def version(self) -> int:
        return self._changes[-1][1]

    def set_version(self, version: int) -> None:
        """Load policy ``version``: tokens produced from now on are its."""
        self._changes.append((self.clock(), version))
        self._wake()

    def version_at(self, clock: float) -> int:
        """The version of a token produced at ``clock`` (a change at ``t`` applies after ``t``)."""
        return self._changes[bisect.bisect_left(self._changes, (clock, -1)) - 1][1]

    async def admit(self) -> None:
        """Return when new requests may start (at once unless paused)."""
        await self._running.wait()

    @contextmanager
    def flight(self, rid: str) -> Iterator[Flight]:
        """Register a generation under request id ``rid`` while it runs."""
        flight = Flight(rid, self)
        # Two requests may share an id (a client reused it): the later one is what an abort finds.
        self.flights[rid] = flight
        self._idle.clear()
        try:
            yield flight
        finally:
            if self.flights.get(rid) is flight:
                del self.flights[rid]
            if not self.flights:
                self._idle.set()

    def abort(self, rids: Sequence[str] | None = None, *, prefix: bool = False) -> int:
        """Abort the generations with these ids (``prefix``: ids that start with one of them,
        as SGLang matches), or all of them (``None``); how many were found."""
        found = [
            f
            for rid, f in self.flights.items()
            if rids is None or rid in rids or (prefix and any(rid.startswith(r) for r in rids))
        ]
        for flight in found:
            flight.aborted = True
            flight.wake()
        return len(found)

    async def pause(self, mode: PauseMode) -> None:
        """Hold new requests, and abort, freeze or wait for those in flight."""
        self.paused = mode
        self._running.clear()
        if mode == "abort":
            self.abort()
        elif mode == "keep" and self._frozen_since is None:
            self._frozen_since = time.monotonic()
            self._wake()
        elif mode == "wait":
            await self._idle.wait()

    def resume(self) -> None:
        """Start held requests; frozen generations go on from where they stood."""
        if self._frozen_since is not None:
            self._frozen_total += time.monotonic() - self._frozen_since
            self._frozen_since = None
        self.paused = None
        self._running.set()
        self._wake()

    def shutdown(self) -> None:
        """Abort everything and let held requests through (the server is stopping)."""
        self.abort()
        self.resume()

    def _wake(self) -> None:
        for flight in self.flights.values():
            flight.wake()
