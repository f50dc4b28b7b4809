"""Where each rollout of a host is now: what a live run's status (``_driver/control``) polls.

Read, not recorded: the phase comes from the spans the rollout already keeps on its trace
(``Timing``: boot, setup, agent, finalize and scoring) and from the model calls its session
has waiting upstream, so a rollout pays nothing for being watched; the host answers a poll
with one small record per rollout. The model servers' in-flight counts come from the pool of
each model the rollouts use (``ServerPool``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._core.rollout import Rollout

PHASES = ("queued", "boot", "setup", "agent", "model call", "tool call", "scoring")
"""The phases a live rollout is reported in, in the order they run. ``queued``: the driver
started it and no host reports it yet (it waits for room, or is on its way). A program
harness's model and tool calls go through its node's services, not its host: such a rollout
reads ``agent`` throughout its agent phase."""


def phase_of(rollout: Rollout) -> tuple[str, float]:
    """``rollout``'s phase now and since when (epoch seconds)."""
    timing = rollout.trace.timing
    if timing.finalize.start:
        return "scoring", timing.finalize.start
    if timing.agent.start:
        calling = rollout.session.calling
        if calling:
            return "model call", min(call.time.start for call in calling)
        tools = rollout._local_tools  # an in-process harness's; a program's run at the node's tool server
        if tools is not None and tools.calling:
            return "tool call", min(tools.calling)
        return "agent", timing.agent.start
    if timing.setup.start:
        return "setup", timing.setup.start
    return "boot", timing.boot.start or timing.start


def live_report(rollouts: Iterable[tuple[str, Rollout]]) -> dict[str, Any]:
    """One record per ``(label, rollout)`` and the model servers they use, as a host answers
    a poll: ``{"rollouts": [{label, id, task, phase, since}], "servers": [{url, in_flight,
    failures, down}]}``."""
    records, models = [], {}
    for label, rollout in rollouts:
        phase, since = phase_of(rollout)
        records.append(
            {"label": label, "id": rollout.trace.id, "task": rollout.task.data.idx, "phase": phase, "since": since}
        )
        models[id(rollout.session.model)] = rollout.session.model
    return {"rollouts": records, "servers": [s for model in models.values() for s in _servers(model)]}


def _servers(model: Any) -> list[dict[str, Any]]:
    pool = getattr(model, "pool", None)  # an OpenAIModel's; other models report none
    if pool is None:
        return []
    now = pool.clock()
    return [
        {"url": s.url, "in_flight": s.inflight, "failures": s.failures, "down": s.down_until > now}
        for s in pool.servers
    ]
