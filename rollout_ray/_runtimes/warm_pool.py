"""A runtime host's warm pool: sandboxes over an image, started before a rollout asks for one.

The driver knows which tasks come next (``Executor.prepare``): each host is told how many of
the upcoming rollouts over each image may come its way (``want``). The pool keeps that many
started, idle sandboxes per image — fewer once it has measured how often they are taken and
how long one takes to start: enough to cover the takes that arrive while one starts (twice
over), never more than are coming, nor more than ``max_idle`` in all. A member is started,
runs ``true`` once (a broken image fails there, not in a rollout), and waits; ``take`` hands
out one that is still intact (``LocalRuntime.intact``: its directories, cgroups and mounts
are all there) or none; when the schedule moves on, ``want`` trims what is no longer coming.
Members are the host's runtimes like any other: its guardian removes them if it dies.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from .sandbox import SandboxRuntime

log = logging.getLogger("rollout_ray")

EWMA = 0.2
"""Weight of the latest measurement in the averages of start time and time between takes."""
DEFAULT_MAX_IDLE = 64


@dataclass
class ImageStats:
    """What the pool measured of one image's sandboxes."""

    start_seconds: float | None = None
    """Average time one took to start (its directories, mounts, cgroups, the ``true`` check)."""
    take_interval: float | None = None
    """Average time between two rollouts asking for one."""
    last_take: float | None = None
    hits: int = 0
    misses: int = 0

    def started(self, seconds: float) -> None:
        self.start_seconds = (
            seconds if self.start_seconds is None else ((1 - EWMA) * self.start_seconds + EWMA * seconds)
        )

    def taken(self, now: float, hit: bool) -> None:
        if self.last_take is not None:
            gap = now - self.last_take
            self.take_interval = gap if self.take_interval is None else (1 - EWMA) * self.take_interval + EWMA * gap
        self.last_take = now
        self.hits += hit
        self.misses += not hit


class WarmPool:
    """Idle sandboxes per image, made with ``start(image)`` and ended with ``stop(runtime)``."""

    def __init__(
        self,
        start: Callable[[str], Awaitable[SandboxRuntime]],
        stop: Callable[[SandboxRuntime], Awaitable[None]],
        max_idle: int = DEFAULT_MAX_IDLE,
    ) -> None:
        self._start = start
        self._stop = stop
        self.max_idle = max_idle
        self.idle: dict[str, deque[SandboxRuntime]] = {}
        self.wanted: dict[str, int] = {}
        self.stats: dict[str, ImageStats] = {}
        self._starting: dict[str, int] = {}
        self._fills: dict[str, asyncio.Task[None]] = {}
        self._stopping: set[asyncio.Future[None]] = set()
        self._closed = False

    def target(self, image: str) -> int:
        """Members to keep for ``image``: those coming (``want``), or, once takes are measured,
        those taken while two start, at least one while any is coming."""
        coming = self.wanted.get(image, 0)
        stats = self.stats.get(image)
        if coming == 0 or stats is None or stats.take_interval is None or stats.start_seconds is None:
            return coming
        needed = math.ceil(2 * stats.start_seconds / max(stats.take_interval, 1e-6))
        return max(1, min(coming, needed))

    def want(self, wanted: Mapping[str, int]) -> list[SandboxRuntime]:
        """The rollouts over each image that may come next; returns the idle members no longer
        wanted (the caller stops them), and starts filling what is missing."""
        self.wanted = {image: n for image, n in wanted.items() if n > 0}
        surplus = []
        for image, members in self.idle.items():
            while len(members) > self.target(image):
                surplus.append(members.popleft())  # the oldest first
        self._fill()
        return surplus

    def take(self, image: str) -> SandboxRuntime | None:
        """An intact idle member over ``image``, or ``None`` (the caller starts one); refills."""
        members = self.idle.get(image)
        found = None
        while members and found is None:
            member = members.pop()  # the youngest: the least time for anything to go wrong
            if member.intact():
                found = member
            else:
                log.warning("warm pool: dropping sandbox %s over %s: no longer intact", member.name, image)
                self._background(self._stop(member))
        self.stats.setdefault(image, ImageStats()).taken(time.monotonic(), found is not None)
        self._fill()
        return found

    def measured(self, image: str, seconds: float) -> None:
        """A sandbox over ``image`` took ``seconds`` to start (a member or a rollout's own)."""
        self.stats.setdefault(image, ImageStats()).started(seconds)

    def _fill(self) -> None:
        if self._closed:
            return
        for image in self.wanted:
            if self._missing(image) > 0 and (image not in self._fills or self._fills[image].done()):
                self._fills[image] = asyncio.get_running_loop().create_task(self._fill_image(image))

    def _missing(self, image: str) -> int:
        held = sum(len(m) for m in self.idle.values()) + sum(self._starting.values())
        have = len(self.idle.get(image, ())) + self._starting.get(image, 0)
        return min(self.target(image) - have, self.max_idle - held)

    async def _fill_image(self, image: str) -> None:
        """Start members one after the other while ``image`` misses some (the node's start gate
        spaces them out further)."""
        while not self._closed and self._missing(image) > 0:
            self._starting[image] = self._starting.get(image, 0) + 1
            try:
                member = await self._start(image)
            except Exception as e:  # noqa: BLE001 - a rollout over it will fail with the reason
                log.warning("warm pool: cannot start a sandbox over %s: %s", image, e)
                return
            finally:
                self._starting[image] -= 1
            if self._closed or self._missing(image) < 0:
                await self._stop(member)
                return
            self.idle.setdefault(image, deque()).append(member)

    def _background(self, stopping: Awaitable[None]) -> None:
        task = asyncio.ensure_future(stopping)
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def settled(self) -> None:
        """Return once no member is being started (tests and benchmarks wait for a full pool)."""
        while fills := [t for t in self._fills.values() if not t.done()]:
            await asyncio.gather(*fills, return_exceptions=True)

    async def close(self) -> list[SandboxRuntime]:
        """Stop filling; returns every idle member (the caller stops them)."""
        self._closed = True
        for task in self._fills.values():
            task.cancel()
        await asyncio.gather(*self._fills.values(), *self._stopping, return_exceptions=True)
        members = [m for ms in self.idle.values() for m in ms]
        self.idle.clear()
        return members

    def statistics(self) -> dict[str, dict[str, float | int | None]]:
        return {
            image: {
                "idle": len(self.idle.get(image, ())),
                "target": self.target(image),
                "hits": s.hits,
                "misses": s.misses,
                "start_seconds": s.start_seconds,
                "take_interval": s.take_interval,
            }
            for image, s in self.stats.items()
        }
