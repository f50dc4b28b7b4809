"""A single-turn QA taskset as users write it (upstream's loader id: ``v1-qa``). Every third
row's ``answer`` is off by one, so rewards differ task by task and a comparison can fail."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf


class QAData(vf.TaskData):
    answer: int


class QATask(vf.Task[QAData]):
    @vf.reward(weight=2.0)
    async def correct(self, task: QAData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == str(task.answer))

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)

    @vf.metric
    async def reply(self, trace: vf.Trace) -> dict[str, float]:
        return {"reply_chars": float(len(trace.last_reply))}


class QATaskset(vf.Taskset[QATask]):
    def load(self) -> Iterator[QATask]:
        for i in range(6):
            a, b = 3 * i + 1, 7 * i + 2
            yield QATask(
                QAData(
                    prompt=f"What is {a} + {b}?",
                    answer=a + b + (i % 3 == 0),
                    system_prompt="Answer with the number only.",
                ),
                self.config.task,
            )


__all__ = ["QATaskset"]
