"""One complete rollout, in-process: a task with a tool, a reward and a metric.

The model is ``ScriptedModel`` (it asks for the calculator, then answers) and the harness is
``ScriptedHarness`` (an in-process agent loop). The runtime is a real ``LocalRuntime``: a
private directory and process group, which the task's ``finalize`` uses to write a file.

    python examples/single_rollout.py
"""

from __future__ import annotations

import asyncio
import logging
import sys

from rollout_ray import (
    LocalRuntime,
    Rollout,
    RolloutLimits,
    RolloutTimeouts,
    Runtime,
    Task,
    TaskData,
    Trace,
    metric,
    reward,
)
from rollout_ray.testing import Reply, ScriptedHarness, ScriptedModel


class ArithData(TaskData):
    answer: int


class Arith(Task):
    data_type = ArithData

    async def finalize(self, trace: Trace, runtime: Runtime) -> None:
        await runtime.write("answer.txt", trace.last_reply)

    @reward(weight=1.0)
    async def correct(self, task: ArithData, runtime: Runtime) -> float:
        written = (await runtime.read("answer.txt")).decode()
        return float(written.strip() == str(task.answer))

    @metric
    def tool_calls(self, trace: Trace) -> float:
        return len(trace.tool_messages)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main() -> Trace:
    task = Arith({"prompt": "What is 17 + 25?", "answer": 42})
    model = ScriptedModel([Reply(tool_calls=[("add", {"a": 17, "b": 25})]), "42"])
    rollout = Rollout(
        task,
        ScriptedHarness(tools={"add": add}),
        model=model,
        runtime_factory=LocalRuntime,  # the rollout owns a private work dir
        limits=RolloutLimits(max_turns=8),
        timeouts=RolloutTimeouts(setup=30, agent=60, finalize=30, scoring=30),
    )
    return await rollout.run()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    trace = asyncio.run(main())
    print()
    print(f"ok={trace.ok} stop={trace.stop_condition} reward={trace.reward:.3f}")
    print(
        f"turns={trace.num_turns} tokens in/out/total="
        f"{trace.num_input_tokens}/{trace.num_output_tokens}/{trace.num_total_tokens}"
    )
    print(f"rewards={trace.rewards} metrics={trace.metrics}")
    for name, span in trace.timing.spans().items():
        print(f"  {name:<9} {span.duration * 1000:8.2f} ms")
    for message in trace.messages:
        print(f"  [{message.role}] {getattr(message, 'content', '') or getattr(message, 'tool_calls', '')}")
