"""Issue 23 §2: the cluster's cap on sandbox starts (the limiter's logic, as its actor runs it)."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("ray")

from rollout_ray._ray import start_limiter
from rollout_ray._ray.start_limiter import _StartLimiter


def test_no_more_tickets_out_than_the_concurrency() -> None:
    async def main() -> None:
        limiter = _StartLimiter(2, None)
        first, second = await limiter.acquire(), await limiter.acquire()
        third = asyncio.ensure_future(limiter.acquire())
        await asyncio.sleep(0.05)
        assert not third.done() and limiter.statistics()["out"] == 2
        await limiter.release(first)
        assert await asyncio.wait_for(third, 5) not in (first, second)

    asyncio.run(main())


def test_a_ticket_its_dead_holder_never_returned_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(start_limiter, "TICKET_SECONDS", 0.1)

    async def main() -> None:
        limiter = _StartLimiter(1, None)
        await limiter.acquire()  # its holder dies: never released
        await asyncio.wait_for(limiter.acquire(), 5)

    asyncio.run(main())


def test_no_more_tickets_a_second_than_the_rate() -> None:
    async def main() -> float:
        limiter = _StartLimiter(None, 4.0)
        t0 = time.monotonic()
        for _ in range(8):
            await limiter.release(await limiter.acquire())
        return time.monotonic() - t0

    assert asyncio.run(main()) >= 0.9  # 4 at once, then one every 0.25 s
