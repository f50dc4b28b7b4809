"""A verifiers v1 environment as its users write it, run unchanged on rollout_ray:

    pip install 'rollout_ray[verifiers]'
    rollout-ray eval --verifiers examples/verifiers_env.py --samples 4

Nothing here imports rollout_ray: the taskset is upstream's (``verifiers.v1``), exported in
``__all__`` as upstream's loader wants it. rollout-ray maps its tasks onto ours and scores them
with its own ``@reward`` / ``@metric`` methods (``rollout_ray/_verifiers``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: int


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def correct(self, task: ArithData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == str(task.answer))

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))

    @vf.metric
    async def tokens(self, trace: vf.Trace) -> dict[str, float]:
        usage = trace.usage
        return {"completion_tokens": float(usage.completion_tokens if usage else 0)}


class ArithTaskset(vf.Taskset[ArithTask]):
    def load(self) -> Iterator[ArithTask]:
        rng = random.Random(0)
        for _ in range(8):
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            yield ArithTask(
                ArithData(prompt=f"What is {a} + {b}?", answer=a + b, system_prompt="Answer with the number only."),
                self.config.task,
            )


__all__ = ["ArithTaskset"]
