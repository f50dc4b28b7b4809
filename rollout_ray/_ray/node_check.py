"""Which nodes of a Ray cluster cannot run a runtime kind, asked of each node.

A remote cluster's nodes are not the driver machine's to judge (a KubeRay pod without a user
namespace cannot run the sandbox however well the laptop driving it can): one zero-CPU task
per alive node runs the provider's ``unavailable()`` there, so ``rollout-ray eval`` can say
in one line, before any rollout runs, what its rollouts will get.
"""

from __future__ import annotations

import asyncio

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._runtimes.providers import AUTO, AUTO_ORDER, provider
from .calls import call

CHECK_TIMEOUT = 60.0
"""Seconds a node may take to answer (its first task may start a worker process)."""


@ray.remote(num_cpus=0, max_retries=0)
def _unavailable(kind: str) -> str | None:
    try:
        found = provider(kind)
    except ValueError:  # declared by a package the driver has and this node lacks
        return f"no runtime provider {kind!r} on this node: install the package declaring it there"
    return found.unavailable()


async def nodes_lacking(kind: str, *, timeout: float = CHECK_TIMEOUT) -> tuple[dict[str, str], int]:
    """``{node address: why it cannot run kind}`` for every alive node that cannot (for
    ``auto``: the first of ``AUTO_ORDER``, the one it would fall back from); a node that does
    not answer within ``timeout`` seconds is among them, saying so; and how many nodes were asked.

    Raises:
        ValueError: an unknown kind.
    """
    checked = AUTO_ORDER[0] if kind == AUTO else provider(kind).name
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    asked = [
        _unavailable.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
        ).remote(checked)
        for n in nodes
    ]

    async def answer(ref: object) -> str | None:
        try:
            reason: str | None = await call(ref, timeout=timeout)
            return reason
        except TimeoutError:
            return f"it did not answer within {timeout:g}s"

    reasons = await asyncio.gather(*(answer(r) for r in asked))
    return {n["NodeManagerAddress"]: r for n, r in zip(nodes, reasons, strict=True) if r is not None}, len(nodes)
