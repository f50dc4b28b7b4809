"""The phases where a rollout runs its task's and harness's own code, each under its deadline.

``run_setup``: task setup then harness setup, under one shared deadline (B11).
``finalize_and_score``: task finalize, then task and harness scoring together (B41–B48);
both stamp their timing spans on the trace. Failures are raised as ``TaskError`` /
``HarnessError`` for the rollout to record.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .aio import gather_all
from .._errors import HarnessError, TaskError, boundary
from .harness import Harness
from .hooks import call_by_name
from .limits import RolloutTimeouts
from .task import Task
from .._record.trace import Trace


async def run_setup(task: Task, harness: Harness, trace: Trace, runtime: Any, timeouts: RolloutTimeouts) -> None:
    """Task setup then harness setup, under one shared deadline (B11)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeouts.setup is None else loop.time() + timeouts.setup
    with boundary(TaskError, "task setup"):
        async with asyncio.timeout_at(deadline):
            await call_by_name(task.setup, {"trace": trace, "runtime": runtime})
    with boundary(HarnessError, "harness setup"):
        async with asyncio.timeout_at(deadline):
            await harness.setup(runtime)


async def finalize_and_score(task: Task, harness: Harness, trace: Trace, runtime: Any,
                             timeouts: RolloutTimeouts) -> None:
    """Task finalize, then task and harness scoring concurrently, each under its timeout."""
    timing = trace.timing
    timing.finalize.start = time.time()
    with boundary(TaskError, "task finalize"):
        async with asyncio.timeout(timeouts.finalize):
            await call_by_name(task.finalize, {"trace": trace, "runtime": runtime})
    timing.finalize.end = timing.scoring.start = time.time()
    with boundary(TaskError, "scoring"):
        async with asyncio.timeout(timeouts.scoring):
            await gather_all([task.score(trace, runtime), harness.score(trace, runtime, task.data)])
    timing.scoring.end = time.time()
