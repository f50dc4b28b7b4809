"""Seed → run → record: how rewards and metrics land on a trace (B47, B48).

Every expected signal name is *seeded* with ``None`` before anything runs, so a signal whose
scorer raised stays visible as "expected but never scored". Phases run one after another
(metrics, then rewards, then judges); the hooks of one phase run concurrently, and their
results are recorded only when the whole phase succeeded. A scalar result is stored under
the hook's name; a mapping result stores each of its keys and drops the hook's own seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import TaskError
from .._record.agent_branches import set_reward_agent
from .._record.trace import Trace
from .aio import gather_all
from .hooks import Hook, call_by_name


def seed(trace: Trace, *, metrics: Sequence[str] = (), rewards: Sequence[str] = ()) -> None:
    """Set each expected name to ``None``, overwriting earlier values."""
    for name in metrics:
        trace.metrics[name] = None
    for name in rewards:
        trace.rewards[name] = None


async def run_metrics(trace: Trace, hooks: Sequence[Hook], available: Mapping[str, Any]) -> None:
    results = await gather_all(call_by_name(h.fn, available) for h in hooks)
    for hook, result in zip(hooks, results, strict=True):
        if isinstance(result, Mapping):
            _unseed(trace.metrics, hook.name)
            trace.record_metrics(result)
        else:
            trace.record_metric(hook.name, result)


async def run_rewards(trace: Trace, hooks: Sequence[Hook], available: Mapping[str, Any]) -> None:
    """Run the reward hooks together and record their results.

    Raises:
        TaskError: a reward is not a finite number (NaN or infinite would poison every
            group statistic it entered); nothing of the phase is recorded.
    """
    results = await gather_all(call_by_name(h.fn, available) for h in hooks)
    for hook, result in zip(hooks, results, strict=True):
        for name, value in result.items() if isinstance(result, Mapping) else [(hook.name, result)]:
            if not math.isfinite(float(value)):
                raise TaskError(f"@reward {name} returned {value!r}: a reward must be a finite number")
    for hook, result in zip(hooks, results, strict=True):
        names = list(result) if isinstance(result, Mapping) else [hook.name]
        if isinstance(result, Mapping):
            _unseed(trace.rewards, hook.name)
            for key, value in result.items():
                trace.record_reward(key, value, hook.weight)
        else:
            trace.record_reward(hook.name, result, hook.weight)
        if hook.agent is not None:
            for name in names:
                set_reward_agent(trace, name, hook.agent)


def _unseed(values: dict[str, Any], name: str) -> None:
    if name in values and values[name] is None:
        del values[name]
