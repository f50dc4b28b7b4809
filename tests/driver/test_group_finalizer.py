"""GroupFinalizer's writes: a slow run's groups within ``write_within`` seconds, a fast run's
``rows_per_write`` rows at once (fewer, larger shards), and everything at the end."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor, Future
from typing import Any

import pyarrow as pa
import pytest

from rollout_ray._driver.finalize import FinalizeConfig
from rollout_ray._driver.group_finalizer import GroupFinalizer
from rollout_ray._record.arrow import RolloutRecord
from rollout_ray._record.trace import Trace, TraceTask

from conftest import run


class Inline(Executor):
    """The writer thread, run in line: the test's clock is the loop's virtual one."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(fn(*args, **kwargs))
        return done


def member(group_id: str) -> list[RolloutRecord]:
    return [RolloutRecord(Trace(task=TraceTask(type="T")), "run", group_id, 0)]


def test_groups_are_written_when_due_or_a_write_is_full_and_the_rest_at_the_end() -> None:
    writes: list[tuple[int, float]] = []  # (sample rows, loop time)

    class Store:
        def write(self, samples: pa.Table, summaries: pa.Table) -> None:
            assert summaries.num_rows == samples.num_rows  # one sample per group here
            writes.append((samples.num_rows, asyncio.get_running_loop().time()))

    async def main() -> float:
        emitted: list[str] = []
        closer = GroupFinalizer(
            config=FinalizeConfig(),
            judge=None,
            store=Store(),
            io=Inline(),  # type: ignore[arg-type]
            emit=lambda g: asyncio.sleep(0, emitted.append(g.group_id)),
            rows_per_write=3,
            write_within=2.0,
        )
        running = asyncio.create_task(closer.run())
        t0 = asyncio.get_running_loop().time()
        await closer.close("slow", member("slow"))
        await asyncio.sleep(1.5)
        assert emitted == ["slow"] and writes == []  # handed on at once, written when due
        await asyncio.sleep(1.0)
        assert writes == [(1, pytest.approx(t0 + 2.0, abs=0.01))]
        for group_id in ("b", "c", "d", "e"):  # a burst: one full write now, the rest when due
            await closer.close(group_id, member(group_id))
        await asyncio.sleep(0.1)
        assert [rows for rows, _ in writes] == [1, 3] and writes[1][1] == pytest.approx(t0 + 2.5, abs=0.01)
        await closer.close("last", member("last"))
        closer.finish()
        await running
        await closer.flush()  # the driver's end of run: what is buffered is written at once
        assert emitted == ["slow", "b", "c", "d", "e", "last"]
        return t0

    t0 = run(main())
    assert [rows for rows, _ in writes] == [1, 3, 2]
    assert writes[2][1] == pytest.approx(t0 + 2.6, abs=0.05)  # not 2 s after "e": at the end


def test_while_groups_keep_closing_finalizes_are_gather_seconds_apart() -> None:
    """One group closing every 10 ms for a second: ~10 finalizes (a tenth of a second apart,
    each taking the groups that closed meanwhile), not 100; the first is at once."""

    async def main() -> tuple[list[float], list[str]]:
        emitted: list[str] = []
        at: list[float] = []

        def emit(group: Any) -> Any:
            emitted.append(group.group_id)
            at.append(asyncio.get_running_loop().time())
            return asyncio.sleep(0)

        closer = GroupFinalizer(
            config=FinalizeConfig(), judge=None, store=None, io=Inline(), emit=emit, rows_per_write=1000, gather=0.1
        )
        running = asyncio.create_task(closer.run())
        t0 = asyncio.get_running_loop().time()
        for i in range(100):
            await closer.close(f"g{i}", member(f"g{i}"))
            await asyncio.sleep(0.01)
        closer.finish()
        await running
        return [round(t - t0, 3) for t in at], emitted

    at, emitted = run(main())
    assert emitted == [f"g{i}" for i in range(100)]  # every group, in closing order
    finalizes = sorted(set(at))
    assert finalizes[0] == 0.0 and 9 <= len(finalizes) <= 12, finalizes
    assert all(b - a >= 0.1 - 1e-6 for a, b in zip(finalizes, finalizes[1:])), finalizes
