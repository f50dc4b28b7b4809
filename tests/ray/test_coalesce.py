"""Coalescer: calls made while a batch is in flight leave together, each gets its own answer."""

from __future__ import annotations

import asyncio

import pytest

from rollout_ray._ray.coalesce import Coalescer

from conftest import run


class Service:
    """A batched remote call the test releases by hand."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.fail_with: Exception | None = None

    async def send(self, items: list[int]) -> list[int | BaseException]:
        self.batches.append(items)
        await self.release.wait()
        if self.fail_with is not None:
            raise self.fail_with
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]


def test_an_idle_service_gets_a_call_at_once_and_a_busy_one_gets_the_rest_together() -> None:
    async def main() -> tuple[list[list[int]], list[object]]:
        service = Service()
        calls = Coalescer(service.send)
        first = asyncio.ensure_future(calls(0))
        await asyncio.sleep(0)  # the first batch leaves alone
        await asyncio.sleep(0)
        rest = [asyncio.ensure_future(calls(i)) for i in (2, 4, 6)]
        await asyncio.sleep(0)
        service.release.set()
        results = await asyncio.gather(first, *rest)
        return service.batches, results

    batches, results = run(main())
    assert batches == [[0], [2, 4, 6]]
    assert results == [0, 20, 40, 60]


def test_each_item_gets_its_own_exception_and_its_neighbours_their_results() -> None:
    async def main() -> list[object]:
        service = Service()
        service.release.set()
        calls = Coalescer(service.send)
        return await asyncio.gather(*(calls(i) for i in range(4)), return_exceptions=True)

    results = run(main())
    assert results[0] == 0 and results[2] == 20
    assert [str(r) for r in results[1::2]] == ["odd 1", "odd 3"]


def test_a_failed_batch_fails_every_item_of_it() -> None:
    async def main() -> list[object]:
        service = Service()
        service.fail_with = ConnectionError("actor died")
        service.release.set()
        calls = Coalescer(service.send)
        return await asyncio.gather(*(calls(i) for i in range(3)), return_exceptions=True)

    assert [type(r) for r in run(main())] == [ConnectionError] * 3


def test_batches_are_capped_and_a_cancelled_caller_does_not_disturb_the_others() -> None:
    async def main() -> tuple[list[list[int]], list[object]]:
        service = Service()
        calls = Coalescer(service.send, max_batch=2)
        tasks = [asyncio.ensure_future(calls(i * 2)) for i in range(5)]
        await asyncio.sleep(0)
        tasks[3].cancel()
        service.release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return service.batches, results

    batches, results = run(main())
    assert batches == [[0, 2], [4, 8]]  # 6 was cancelled before its batch left
    assert results[:3] + results[4:] == [0, 20, 40, 80]
    assert isinstance(results[3], asyncio.CancelledError)


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        Coalescer(Service().send, max_batch=0)
