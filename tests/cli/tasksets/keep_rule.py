"""Eight tasks, groups of the odd ones refused by a keep rule, three groups wanted (max_groups)."""

import pyarrow as pa

from rollout_ray import ChatHarness, EvalConfig, Task, TaskData, Trace, reward


class Sum(TaskData):
    answer: str


class Add(Task):
    data_type = Sum

    @reward
    def correct(self, task: Sum, trace: Trace) -> float:
        return float(trace.last_reply.strip() == task.answer)


def even_tasks(samples: pa.Table) -> bool:
    return samples["task_idx"][0].as_py() % 2 == 0


config = EvalConfig(keep_group=even_tasks, max_groups=3, max_in_flight=1)


def tasks() -> list[Add]:
    return [Add({"prompt": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(8)]


def harness() -> ChatHarness:
    return ChatHarness()
