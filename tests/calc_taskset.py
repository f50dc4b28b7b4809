"""The arithmetic task with a calculator tool, shared by the rollout tests of every executor.

``Arith`` asks for a sum ("1+2?", "What is 17 + 25?") and offers ``Calc``, whose one tool
``add`` runs in the test's process. Two variants: ``ArithWithDiv`` adds ``div``, a tool that
raises on a zero divisor; ``ShellArith``'s ``add`` runs a shell in the rollout's runtime, so a
rollout that calls it provisions its runtime. Every toolset here is named ``calc``. A test
that ships these classes to Ray registers this module to be pickled by value (its workers
cannot import it).
"""

from __future__ import annotations

import re
from typing import Any

from rollout_ray import Runtime, Task, TaskData, Toolset, Trace, metric, reward, tool


class Calc(Toolset):
    name = "calc"

    @tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class CalcWithDiv(Calc):
    name = "calc"

    @tool
    def div(self, a: int, b: int) -> float:
        return a / b


class ShellCalc(Toolset):
    name = "calc"

    @tool
    async def add(self, a: int, b: int, runtime: Runtime) -> str:
        """Add two integers (computed by a shell in the rollout's runtime)."""
        result = await runtime.exec(["sh", "-c", f"echo $(({a} + {b}))"])
        return result.stdout.strip()


class Arith(Task):
    """Rewarded when the last reply is the sum of the numbers in the prompt."""

    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [Calc()]

    @reward
    def correct(self, task: TaskData, trace: Trace) -> float:
        numbers = re.findall(r"\d+", task.prompt if isinstance(task.prompt, str) else "")
        return float(trace.last_reply == str(sum(map(int, numbers))))

    @metric
    def tool_calls(self, trace: Trace) -> float:
        return len(trace.tool_calls)


class ArithWithDiv(Arith):
    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [CalcWithDiv()]


class ShellArith(Arith):
    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [ShellCalc()]
