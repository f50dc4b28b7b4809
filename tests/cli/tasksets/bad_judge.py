"""A judge that breaks its contract: it returns a list, not a mapping of reward_* / metric_* columns."""

from rollout_ray import ChatHarness, Task


def tasks() -> list[Task]:
    return [Task({"prompt": f"What is {i} + 1?"}) for i in range(3)]


def harness() -> ChatHarness:
    return ChatHarness()


def judge(group):  # type: ignore[no-untyped-def]
    return [1.0] * group.num_rows
