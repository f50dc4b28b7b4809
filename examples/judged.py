"""A taskset with a judge: one call per group, over its samples' rows, after the group statistics.

    rollout-ray eval examples/judged.py --samples 4
    rollout-ray eval examples/judged.py --samples 4 --temperature 1.5    # the samples disagree

A ``judge`` is a function of the taskset module. It gets one group's table (a row per sample,
``read_run``'s columns: ``reward``, ``ok``, ``num_output_tokens``, ``messages``, the group
columns ...) and returns ``None`` or a mapping from new column names, each starting with
``reward_`` or ``metric_``, to one float (or None) per row. Those columns are stored with the
samples. Anything else (a list, a name without the prefix, a wrong length) fails the judge on
that group: the rollouts are stored, ``judge_error`` says why, the summary counts it and eval
exits 4.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pyarrow as pa

from rollout_ray import ChatHarness, EvalConfig, Task, TaskData, Trace, reward


class ArithData(TaskData):
    answer: int


class Arith(Task):
    data_type = ArithData

    @reward
    def correct(self, task: ArithData, trace: Trace) -> float:
        return float(trace.last_reply.strip() == str(task.answer))


def tasks(n: int = 20, seed: int = 0) -> list[Arith]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        out.append(
            Arith({"prompt": f"What is {a} + {b}?", "answer": a + b, "system_prompt": "Answer with the number only."})
        )
    return out


def harness() -> ChatHarness:
    return ChatHarness()


def judge(group: pa.Table) -> dict[str, list[float | None]]:
    """``metric_majority``: 1.0 where the sample gave the group's most common answer (self-
    consistency); ``reward_shortest``: 1.0 for the correct samples with the fewest output tokens."""
    answers = [_last_reply(m) for m in group["messages"].to_pylist()]
    majority, _ = Counter(answers).most_common(1)[0]
    correct = [bool(ok) and reward == 1.0 for ok, reward in zip(group["ok"].to_pylist(), group["reward"].to_pylist())]
    tokens = group["num_output_tokens"].to_pylist()
    fewest = min((t for t, c in zip(tokens, correct) if c), default=None)
    return {
        "metric_majority": [float(a == majority) for a in answers],
        "reward_shortest": [float(c and t == fewest) for c, t in zip(correct, tokens)],
    }


def _last_reply(messages: str | None) -> str:
    replies = [m.get("content") or "" for m in json.loads(messages or "[]") if m.get("role") == "assistant"]
    return replies[-1].strip() if replies else ""


config = EvalConfig(samples_per_task=4)
