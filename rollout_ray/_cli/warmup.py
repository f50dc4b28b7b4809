"""The run-level warm-up: Ray, the rollout actors, their runtime actors and the nodes' services
started and answering before the first rollout is scheduled.

Actors start asynchronously: without this, the first rollouts wait for their actor, its
runtime actor and the node's services to come up, and that wait lands in their ``setup``
span (2.7 s setup p50 on calc_tool; one sweep point's setup 100x the others'). Waiting for
all of them here makes it one ``warmup`` line of the run instead. ``eval`` of an in-process
harness (``ChatHarness``) waits for the rollout actors only: its rollouts need a runtime actor
or the node's services only if a task uses a box, and those start when first needed.
"""

from __future__ import annotations

from .._hosting.executor import Executor

WARMUP_TIMEOUT = 300.0
"""Seconds the actors may take to be placed and start (a cluster may be scaling up)."""


async def warm_up(executor: Executor, timeout: float = WARMUP_TIMEOUT, *, programs: bool = True) -> str | None:
    """Wait until every actor a rollout needs answers; what was waited for, or None (no Ray).
    ``programs=False`` for an in-process harness: see ``RayExecutor.ready``.

    Raises:
        TimeoutError: an actor did not answer within ``timeout`` seconds.
    """
    from .._ray.ray_executor import RayExecutor

    if not isinstance(executor, RayExecutor):
        return None
    return await executor.ready(timeout, programs=programs)
