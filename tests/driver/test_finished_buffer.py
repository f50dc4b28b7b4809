"""Driver memory flat in N (issue 21 §4): when the finalizer falls behind, admission waits.

Finished groups wait for the finalizer in a bounded queue (``EvalConfig.finished_buffer``): a
rollout that finishes a group keeps its slot until the group is queued, so no new rollout is
admitted meanwhile. Before, admission went on and finished groups piled up (10,105 waiting
at 16k done, at 100,000 tasks).
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pytest
from driver_fakes import Timed

from rollout_ray import ChatHarness
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray.testing import ScriptedModel

from conftest import run, tasks

pytestmark = pytest.mark.faults


def test_a_finalizer_that_falls_behind_holds_admission_so_finished_groups_stay_bounded(report: Any) -> None:
    """Rollouts finish at once; the trainer takes a group a second (the finalizer waits on the
    stream, as it would on a slow finalize or write): at most ``finished_buffer`` groups wait in
    the queue, and at most ``max_in_flight`` more finished ones wait to enter it."""
    n, bound, in_flight = 600, 4, 2
    finalized = 0
    waiting: list[int] = []  # finished and not finalized, at each finished rollout

    def judge(group: pa.Table) -> None:  # called once per group as it is finalized
        nonlocal finalized
        finalized += 1

    async def main() -> tuple[int, Any]:
        import asyncio

        driver = Driver(
            tasks(n),
            ChatHarness(),
            ScriptedModel(),
            executor=Timed(),
            judge=judge,
            config=EvalConfig(max_in_flight=in_flight, finished_buffer=bound, stream_buffer=1),
            on_progress=lambda p: waiting.append(p.done - finalized),
            progress_every=0,
        )
        streamed = 0
        async for _ in driver.groups():
            streamed += 1
            await asyncio.sleep(1.0)  # the virtual clock: a slow trainer
        assert driver._finalizer is not None
        return streamed, driver._finalizer.statistics()

    started = time.monotonic()
    streamed, stats = run(main())
    assert streamed == n
    assert stats.most_waiting <= bound and stats.capacity == bound
    assert max(waiting) <= bound + in_flight, max(waiting)
    report(
        "21§4 finalizer falls behind",
        f"{n} groups finish at once, trainer 1 s per group",
        "admission waits for the finalizer",
        f"at most {max(waiting)} finished groups unfinalized (bound {bound} + {in_flight} in flight)",
        time.monotonic() - started,
    )
