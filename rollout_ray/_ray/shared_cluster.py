"""One shared tool server for the whole cluster (``SharedToolServer(scope="cluster")``).

A named actor (``shared-<key>`` in rollout_ray's namespace) holds it: the first process that
opens the toolset creates the actor (``get_if_exists``: every other process finds the same
one), beside itself; the actor starts the server with the node machinery of
``_serving/shared_server`` (a lock, a free loopback port, a watcher that restarts it as soon as
it dies). Every opening asks the actor for the port, which checks the server first (its process
alive, its port answering) and starts it again if not: health-checked per rollout.

The actor is not detached: it ends with the process that created it (a node's services, at the
run's end), and the server with the actor (it dies with the process that started it), or
earlier by ``stop_cluster_servers``. The server listens on loopback: it is reached from the
actor's node; a rollout served on another node fails with ``ToolServerError`` saying so.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._errors import ToolServerError
from .._serving import shared_server
from .._serving.shared_server import SharedToolServer, ensure_running, stop_shared_servers
from .calls import NAMESPACE, call

CALL_TIMEOUT = 120.0
"""Seconds one ask for the port may take: a start waits up to the server's ``ready_timeout``."""


class _ClusterServer:
    """Holds one shared server for the cluster, in its own process."""

    def __init__(self, server: SharedToolServer) -> None:
        self.server = server

    async def port(self) -> tuple[str, int]:
        """``(node id, port)`` of the server, started again first if it is not healthy."""
        return ray.get_runtime_context().get_node_id(), await ensure_running(self.server)

    def status(self) -> dict[str, Any]:
        """What the node records of it: ``pid``, ``port``, ``starts`` (how often it was started)."""
        return shared_server._state(self.server) or {}

    async def shutdown(self) -> None:
        await stop_shared_servers()


ClusterServerActor = ray.remote(num_cpus=0, max_concurrency=1000)(_ClusterServer)  # type: ignore[call-overload]  # ray's overloads omit actor options

_ACTORS: dict[str, Any] = {}
"""This process's handles of the cluster's servers, by key."""


def actor_name(server: SharedToolServer) -> str:
    return f"shared-{server.key}"


def cluster_actor(server: SharedToolServer) -> Any:
    """The actor holding ``server`` for the cluster: found, or created beside this process."""
    handle = _ACTORS.get(server.key)
    if handle is None:
        here = ray.get_runtime_context().get_node_id()
        handle = _ACTORS[server.key] = ClusterServerActor.options(
            name=actor_name(server),
            namespace=NAMESPACE,
            get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True),
        ).remote(server)
    return handle


async def cluster_port(server: SharedToolServer) -> int:
    """The loopback port of the cluster's ``server`` (``shared_server.CLUSTER``).

    Raises:
        ToolServerError: it could not be started, or it runs on another node.
    """
    for attempt in (0, 1):
        try:
            node, port = await call(cluster_actor(server).port.remote(), timeout=CALL_TIMEOUT)
            break
        except RayActorError:  # its holder ended (its creator did): the next one holds it anew
            _ACTORS.pop(server.key, None)
            if attempt:
                raise ToolServerError(server.name, "the actor holding the cluster's server died twice") from None
        except TimeoutError:
            raise ToolServerError(server.name, f"its holder did not answer within {CALL_TIMEOUT:g}s") from None
    here = ray.get_runtime_context().get_node_id()
    if node != here:
        raise ToolServerError(
            server.name,
            f"the cluster's server runs on node {node[:12]}, reached over loopback only; this rollout "
            f"is served on node {here[:12]} (use scope='node', or MCPToolset(url=...) for a server you expose)",
        )
    return int(port)


async def stop_cluster_servers() -> None:
    """Stop the cluster servers this process reached (the end of a run, or of a test)."""
    actors = list(_ACTORS.values())
    _ACTORS.clear()
    for actor in actors:
        try:
            async with asyncio.timeout(10):
                await actor.shutdown.remote()
        except (TimeoutError, RayActorError):
            pass
        ray.kill(actor, no_restart=True)


shared_server.CLUSTER = cluster_port
