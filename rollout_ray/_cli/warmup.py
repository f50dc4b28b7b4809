"""The run-level warm-up: Ray, the rollout actors, their runtime actors and the nodes' services
started and answering before the first rollout is scheduled.

Actors start asynchronously: without this, the first rollouts wait for their actor, its
runtime actor and the node's services to come up, and that wait lands in their ``setup``
span (2.7 s setup p50 on calc_tool; one sweep point's setup 100x the others'). Waiting for
all of them here makes it one ``warmup`` line of the run instead.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .._core.executor import Executor

WARMUP_TIMEOUT = 300.0
"""Seconds the actors may take to be placed and start (a cluster may be scaling up)."""


async def warm_up(executor: Executor, timeout: float = WARMUP_TIMEOUT) -> str | None:
    """Wait until every actor a rollout needs answers; what was waited for, or None (no Ray).

    Raises:
        TimeoutError: an actor did not answer within ``timeout`` seconds.
    """
    from .._ray.executor import RayExecutor

    if not isinstance(executor, RayExecutor):
        return None
    from .._ray.calls import call
    from .._ray.node_service_actor import node_service_actor

    actors = [a for a in executor._pool if a is not None]

    async def ready(actor: Any) -> str:
        node = await call(actor.actor.node_id.remote(), timeout=timeout)
        runtimes = await call(actor.actor.runtime_actor.remote(), timeout=timeout)
        await call(runtimes.pid.remote(), timeout=timeout)
        return str(node)

    nodes = set(await asyncio.gather(*(ready(a) for a in actors)))
    await asyncio.gather(*(call(node_service_actor(n).ping.remote(), timeout=timeout) for n in nodes))
    return (f"{len(actors)} rollout actor{'s' if len(actors) != 1 else ''} with their runtime actors, "
            f"the services of {len(nodes)} node{'s' if len(nodes) != 1 else ''}")
