"""Calls to Ray actors: awaiting one with the actor's own exception, and stopping one."""

from __future__ import annotations

import asyncio
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

NAMESPACE = "rollout_ray"
"""The Ray namespace of the package's named actors."""

SHUTDOWN_GRACE = 5.0
"""Seconds an actor gets to shut down before ``ray.kill``."""


async def call(ref: Any, timeout: float | None = None) -> Any:
    """Await an actor call; an exception raised in the actor comes back as itself.

    Ray wraps it in a ``RayTaskError`` whose type name and message carry Ray's decorations;
    the trace must record the original type and message.

    Raises:
        TimeoutError: no answer within ``timeout`` seconds (the actor may be hung).
    """
    try:
        async with asyncio.timeout(timeout):
            return await ref
    except RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, Exception):
            raise cause from None
        raise


async def stop_actor(actor: Any, grace: float = SHUTDOWN_GRACE) -> None:
    """Ask the actor to ``shutdown()``; ``ray.kill`` it after ``grace`` seconds either way."""
    try:
        async with asyncio.timeout(grace):
            await actor.shutdown.remote()
    except (TimeoutError, RayActorError):
        pass
    ray.kill(actor, no_restart=True)
