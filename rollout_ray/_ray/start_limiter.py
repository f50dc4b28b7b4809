"""The cluster's cap on sandbox starts: one named actor every runtime actor asks for room.

``RayExecutor(sandbox_starts=StartLimits(...))`` creates it (or joins the one another driver of
the cluster created: the first one's limits hold). Each runtime actor looks it up when it
starts and passes its gate (``ClusterStartGate``) with every sandbox start, after the node's.
A start holds a ticket from it; a ticket a dead holder never returned expires after
``TICKET_SECONDS``. The gate fails open: a limiter that is gone or does not answer within
``ASK_TIMEOUT`` lets the start through (logged once), for a run must not stop on its cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import ray
from ray.exceptions import RayActorError

from .._runtimes.start_gate import StartLimits
from .calls import NAMESPACE, call

LIMITER_NAME = "rollout-ray-sandbox-starts"
TICKET_SECONDS = 60.0
"""How long a start may hold its ticket before it counts as returned (its holder died)."""
ASK_TIMEOUT = 600.0
"""Longest a start waits at the cluster's gate before it goes through anyway."""

log = logging.getLogger("rollout_ray")


class _StartLimiter:
    """Tickets to start a sandbox: at most ``concurrency`` out at once, ``per_second`` a second."""

    def __init__(self, concurrency: int | None, per_second: float | None) -> None:
        self.limits = StartLimits(concurrency, per_second)
        self._out: dict[str, float] = {}
        self._tokens = max(1.0, per_second or 1.0)
        self._refilled = time.monotonic()
        self._changed = asyncio.Condition()
        self.granted = 0

    def _wait(self) -> float:
        """Seconds until a ticket can be granted (0: now), after expiring the abandoned ones."""
        now = time.monotonic()
        for ticket in [t for t, expiry in self._out.items() if expiry <= now]:
            del self._out[ticket]
        if self.limits.concurrency is not None and len(self._out) >= self.limits.concurrency:
            return min(self._out.values()) - now
        rate = self.limits.per_second
        if rate is None:
            return 0.0
        self._tokens = min(max(rate, 1.0), self._tokens + (now - self._refilled) * rate)
        self._refilled = now
        return 0.0 if self._tokens >= 1.0 else (1.0 - self._tokens) / rate

    async def acquire(self) -> str:
        async with self._changed:
            while (wait := self._wait()) > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=wait)
            if self.limits.per_second is not None:
                self._tokens -= 1.0
            ticket = uuid.uuid4().hex
            self._out[ticket] = time.monotonic() + TICKET_SECONDS
            self.granted += 1
            return ticket

    async def release(self, ticket: str) -> None:
        async with self._changed:
            self._out.pop(ticket, None)
            self._changed.notify_all()

    def statistics(self) -> dict[str, Any]:
        return {
            "out": len(self._out),
            "granted": self.granted,
            "concurrency": self.limits.concurrency,
            "per_second": self.limits.per_second,
        }


StartLimiterClass = ray.remote(num_cpus=0, max_concurrency=10_000)(_StartLimiter)  # type: ignore[call-overload]  # ray's overloads omit actor options


def create_limiter(limits: StartLimits) -> Any:
    """The cluster's limiter, made with ``limits`` unless another driver made it first."""
    return StartLimiterClass.options(name=LIMITER_NAME, namespace=NAMESPACE, get_if_exists=True).remote(
        limits.concurrency, limits.per_second
    )


def find_limiter() -> Any:
    """The cluster's limiter, or ``None`` when no driver set cluster caps."""
    try:
        return ray.get_actor(LIMITER_NAME, namespace=NAMESPACE)
    except ValueError:
        return None


class ClusterStartGate:
    """A runtime actor's side of the limiter (a ``StartGate``)."""

    def __init__(self, limiter: Any) -> None:
        self._limiter = limiter
        self._said = False

    @contextlib.asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        try:
            ticket: str | None = await call(self._limiter.acquire.remote(), timeout=ASK_TIMEOUT)
        except (RayActorError, TimeoutError) as e:
            if not self._said:
                self._said = True
                log.warning(
                    "the cluster's sandbox start limiter is gone or stuck (%s): starts go through without it",
                    type(e).__name__,
                )
            ticket = None
        try:
            yield
        finally:
            if ticket is not None:
                with contextlib.suppress(RayActorError, TimeoutError):
                    await call(self._limiter.release.remote(ticket), timeout=30.0)
