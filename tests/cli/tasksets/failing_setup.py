"""Every rollout fails: the task's setup raises."""

from rollout_ray import ChatHarness, Task


class Broken(Task):
    async def setup(self, trace, runtime):
        raise RuntimeError("this task cannot be set up")


def tasks():
    return [Broken({"prompt": f"What is {i} + 1?"}) for i in range(2)]


def harness():
    return ChatHarness()
