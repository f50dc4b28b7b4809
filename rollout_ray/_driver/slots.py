"""Slots: how many rollouts a driver runs at once, changeable while it runs, and pausable.

An ``asyncio.Semaphore`` cannot shrink: a lowered limit must wait for rollouts to finish,
never cancel them. So the count is kept here: ``acquire`` waits while ``used >= limit`` or
while paused; lowering the limit lets the rollouts in flight finish and starts none until
fewer than the new limit run.
"""

from __future__ import annotations

import asyncio


class Slots:
    """At most ``limit`` held at once (``acquire`` / ``release``); ``resize``, ``pause`` and
    ``resume`` take effect at once for every waiter."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {limit}")
        self.limit = limit
        self.used = 0
        self.peak = 0
        """The most held at once since it was last reset (``AutoInFlight`` resets it at each
        sample: whether the bound was what held rollouts back)."""
        self.paused = False
        self._changed = asyncio.Event()

    async def acquire(self) -> None:
        while self.paused or self.used >= self.limit:
            self._changed.clear()
            await self._changed.wait()
        self.used += 1
        self.peak = max(self.peak, self.used)

    def release(self) -> None:
        self.used -= 1
        self._changed.set()

    def resize(self, limit: int) -> None:
        """Run at most ``limit`` at once from now on (those in flight above it finish)."""
        if limit < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {limit}")
        self.limit = limit
        self._changed.set()

    def pause(self) -> None:
        """Start nothing until ``resume`` (what runs goes on)."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._changed.set()
