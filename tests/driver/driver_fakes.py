"""An executor that runs no agent, for driver tests where only timing, versions and rewards matter."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from rollout_ray import Trace
from rollout_ray._errors import InfrastructureLost
from rollout_ray._hosting.executor import Executor, failed_trace
from rollout_ray._hosting.spec import RolloutSpec
from rollout_ray._record.trace import ModelCall, Reward


class Timed(Executor):
    """A rollout of task ``idx`` takes ``duration(idx)`` seconds of the loop's clock (virtual in
    the tests; 0: it finishes at once), makes one model call stamped with the policy version
    it starts under, and scores ``reward(idx, run)`` (``run``: how many rollouts of the task
    started, from 1); ``lose(idx, run)`` loses it to the infrastructure instead."""

    def __init__(
        self,
        duration: Callable[[int], float] = lambda idx: 0.0,
        reward: Callable[[int, int], float] = lambda idx, run: 1.0,
        lose: Callable[[int, int], bool] = lambda idx, run: False,
    ) -> None:
        self.duration, self.reward, self.lose = duration, reward, lose
        self.version = 0
        self.runs: Counter[int] = Counter()
        self.started: list[tuple[int, int]] = []
        """(task idx, policy version) of every rollout, in start order."""

    async def set_policy(self, version: int | None, paused: bool) -> None:
        self.version = version or 0

    async def run(self, spec: RolloutSpec) -> Trace:
        idx = spec.task.data.idx
        self.runs[idx] += 1
        run, version = self.runs[idx], self.version
        self.started.append((idx, version))
        if duration := self.duration(idx):
            await asyncio.sleep(duration)
        if self.lose(idx, run):
            return failed_trace(spec, InfrastructureLost("rollout actor died: ActorDiedError"))
        trace = Trace(task=spec.task.trace_task(), ok=True, is_completed=True)
        trace.calls.append(ModelCall(policy=version))
        trace.rewards["r"] = Reward(self.reward(idx, run))
        return trace
