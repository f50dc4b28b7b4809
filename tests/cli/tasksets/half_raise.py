"""Four tasks whose reward raises on the odd ones: half the rollouts fail (TaskError)."""

from rollout_ray import ChatHarness, Task, TaskData, Trace, reward


class Sum(TaskData):
    answer: str
    breaks: bool = False


class Add(Task):
    data_type = Sum

    @reward
    def correct(self, task: Sum, trace: Trace) -> float:
        if task.breaks:
            raise ValueError(f"no grader for {task.prompt!r}")
        return float(trace.last_reply.strip() == task.answer)


def tasks() -> list[Add]:
    return [Add({"prompt": f"What is {i} + 1?", "answer": str(i + 1), "breaks": i % 2 == 1}) for i in range(4)]


def harness() -> ChatHarness:
    return ChatHarness()
