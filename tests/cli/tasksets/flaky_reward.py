"""Four tasks whose reward raises on the first attempt of the odd ones and gives 1.0 otherwise:
with ``--retry-failed`` every rollout is stored ok with reward 1.0, after six attempts of which
two failed. For ``--executor local`` (the attempts are counted in this process)."""

from rollout_ray import ChatHarness, Task, TaskData, Trace, reward

_tried: set[str] = set()


class Sum(TaskData):
    answer: str
    flaky: bool = False


class Add(Task):
    data_type = Sum

    @reward
    def correct(self, task: Sum, trace: Trace) -> float:
        if task.flaky and task.prompt not in _tried:
            _tried.add(task.prompt)
            raise ValueError(f"grader not ready for {task.prompt!r}")
        return 1.0


def tasks() -> list[Add]:
    return [Add({"prompt": f"What is {i} + 1?", "answer": str(i + 1), "flaky": i % 2 == 1}) for i in range(4)]


def harness() -> ChatHarness:
    return ChatHarness()
