"""Limit reservations: the limits hold however many requests a rollout sends at once (B33–B35).

The limits are checked before each model call against what the trace holds, so with one
request at a time ``max_turns=N`` commits N turns and a token cap lets exactly one turn
cross it. A harness that sends requests concurrently would otherwise have all of them pass
the check before any of them commits. The session counts the requests in flight as reserved:

* with a token cap set, a rollout's requests are admitted one at a time: the check then
  sees every earlier turn, and at most one turn can cross the cap (soft by one turn);
* with only ``max_turns``, up to ``max_turns - committed`` requests run at once;
* a request that may not be admitted yet waits for one in flight to finish, then is
  checked as usual: if the limit is reached by then, it is refused with the limit's name.

Nothing waits when no limit is set.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from .limits import RolloutLimits


class LimitReservations:
    """Counts one rollout's model requests in flight; ``admitted()`` waits for a place.

    Args:
        limits: the rollout's limits.
        turns: how many turns the trace holds now.
        closed: raises when the session can take no request any more (released or stopped);
            called whenever a waiting request wakes.
    """

    def __init__(self, limits: RolloutLimits, turns: Callable[[], int], closed: Callable[[], None]) -> None:
        self._limits = limits
        self._turns = turns
        self._closed = closed
        self._token_caps = any(
            cap is not None for cap in (limits.max_input_tokens, limits.max_output_tokens, limits.max_total_tokens)
        )
        self.in_flight = 0
        self._changed: asyncio.Event | None = None

    def _may_enter(self) -> bool:
        if self.in_flight == 0:
            return True
        if self._token_caps:
            return False
        cap = self._limits.max_turns
        return cap is None or self._turns() + self.in_flight < cap

    @asynccontextmanager
    async def admitted(self) -> AsyncIterator[None]:
        """Hold a place for one request for the length of the block."""
        while not self._may_enter():
            if self._changed is None:
                self._changed = asyncio.Event()
            await self._changed.wait()
            self._closed()
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self.wake()

    def wake(self) -> None:
        """Let waiting requests look again (a request finished, or the session closed)."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None
