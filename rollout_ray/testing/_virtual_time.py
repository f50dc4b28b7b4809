"""An event loop with a virtual clock, for exact and instant timeout tests."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """``loop.time()`` starts at 0 and jumps to the next timer whenever nothing is ready.

    ``asyncio.sleep``, ``asyncio.timeout`` and ``timeout_at`` then behave exactly as on a
    real loop, but take no wall time. Only for code that does no real I/O while waiting on a
    timer (an in-flight subprocess or socket would see time jump past it).
    """

    def __init__(self) -> None:
        super().__init__()
        self._virtual_now = 0.0

    def time(self) -> float:
        return self._virtual_now

    def _run_once(self) -> None:
        # Private hook of BaseEventLoop: the one place where the loop would block on timers.
        if not self._ready:  # type: ignore[attr-defined]
            due = [h.when() for h in self._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
            if due:
                self._virtual_now = max(self._virtual_now, min(due))
        super()._run_once()  # type: ignore[misc]


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh ``VirtualTimeLoop`` and close it."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
