"""Three tasks, two of them identical (real datasets repeat prompts): at --samples 2, six rollouts
in three groups. No task sets ``idx``."""

from rollout_ray import ChatHarness, Task, TaskData, Trace, reward


class Sum(TaskData):
    answer: str


class Add(Task):
    data_type = Sum

    @reward
    def correct(self, task: Sum, trace: Trace) -> float:
        return float(trace.last_reply.strip() == task.answer)


def tasks() -> list[Add]:
    same = {"prompt": "What is 2 + 2?", "answer": "4"}
    return [Add(same), Add(same), Add({"prompt": "What is 3 + 4?", "answer": "7"})]


def harness() -> ChatHarness:
    return ChatHarness()
