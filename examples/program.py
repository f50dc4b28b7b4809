"""ProgramHarness: each rollout runs ``agent_program.py`` inside its runtime.

The program reads the conversation from a file, talks to the proxy with the standard
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` variables, calls the tools and prints its answer.
The harness ships it into the runtime (``files``), so it runs the same in a sandbox, which
sees nothing of this checkout.

    rollout-ray eval examples/program.py
    rollout-ray eval examples/program.py --runtime sandbox
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rollout_ray import ProgramHarness, Runtime, Task, TaskData, Trace, metric, reward

sys.path.insert(0, os.path.dirname(__file__))
from calc_tool import Calculator

AGENT = Path(__file__).resolve().parent / "agent_program.py"


class ProgramData(TaskData):
    answer: int


class ProgramTask(Task):
    data_type = ProgramData

    @classmethod
    def toolsets(cls, config: object) -> list[Calculator]:
        return [Calculator()]

    async def finalize(self, trace: Trace, runtime: Runtime) -> None:
        await runtime.write("answer.txt", trace.last_reply)

    @reward
    async def correct(self, task: ProgramData, runtime: Runtime) -> float:
        return float((await runtime.read("answer.txt")).decode().strip() == str(task.answer))

    @metric
    def turns(self, trace: Trace) -> float:
        return trace.num_turns


def tasks(n: int = 10) -> list[ProgramTask]:
    return [ProgramTask({"idx": i, "prompt": f"What is {i} + {2 * i}?", "answer": 3 * i}) for i in range(n)]


def harness() -> ProgramHarness:
    return ProgramHarness(["python3", "agent_program.py"], files={"agent_program.py": AGENT.read_text()})
