"""Single-turn arithmetic: the model answers, a reward checks it.

rollout-ray eval examples/arith.py                 # built-in simulated model, local Ray
rollout-ray eval examples/arith.py --samples 4 --model-url http://127.0.0.1:8000/v1 --model my-model
"""

from __future__ import annotations

import random

from rollout_ray import ChatHarness, EvalConfig, Task, TaskData, Trace, metric, reward


class ArithData(TaskData):
    answer: int


class Arith(Task):
    data_type = ArithData

    @reward
    def correct(self, task: ArithData, trace: Trace) -> float:
        return float(trace.last_reply.strip() == str(task.answer))

    @metric
    def reply_chars(self, trace: Trace) -> float:
        return len(trace.last_reply)


def tasks(n: int = 50, seed: int = 0) -> list[Arith]:
    rng = random.Random(seed)
    out = []
    for idx in range(n):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        out.append(
            Arith(
                {
                    "idx": idx,
                    "prompt": f"What is {a} + {b}?",
                    "answer": a + b,
                    "system_prompt": "Answer with the number only.",
                }
            )
        )
    return out


def harness() -> ChatHarness:
    return ChatHarness()


config = EvalConfig(samples_per_task=4, max_in_flight=64)
