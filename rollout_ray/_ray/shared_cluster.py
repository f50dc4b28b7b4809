"""One shared tool server for the whole cluster (``SharedToolServer(scope="cluster")``).

A named actor (``shared-<key>`` in rollout_ray's namespace) holds it: the first process that
opens the toolset creates the actor (``get_if_exists``: every other process finds the same
one), beside itself; the actor starts the server with the node machinery of
``_serving/shared_server`` (a lock, a free loopback port, a watcher that restarts it as soon as
it dies). Every opening asks the actor for the port, which checks the server first (its process
alive, its port answering) and starts it again if not: health-checked per rollout.

The actor is not detached: it ends with the process that created it (a node's services, at the
run's end), and the server with the actor (it dies with the process that started it), or
earlier by ``stop_cluster_servers``. The server listens on loopback: it is reached there from the
holder's node; from every other node its requests travel over Ray (``shared_relay``): the one
decision is in ``cluster_port``, whether the holder is on this process's node.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._errors import ToolServerError
from .._serving import shared_server
from .._serving.mcp_client import Limits, _Client
from .._serving.shared_server import SharedToolServer, ensure_running, stop_shared_servers
from .calls import NAMESPACE, call
from .shared_relay import relay_client, relayed

CALL_TIMEOUT = 120.0
"""Seconds one ask for the port may take: a start waits up to the server's ``ready_timeout``."""


class _ClusterServer:
    """Holds one shared server for the cluster, in its own process.

    Args:
        server: the server to hold.
        node: the node it says it is on; only tests pass one (another than its own), so that
            a one-node cluster's rollouts take the relay as another node's do.
    """

    def __init__(self, server: SharedToolServer, node: str | None = None) -> None:
        self.server, self.node = server, node or ray.get_runtime_context().get_node_id()
        self.relayed: Counter[str] = Counter()
        """Requests relayed for other nodes, by method."""

    async def port(self) -> tuple[str, int]:
        """``(node id, port)`` of the server, started again first if it is not healthy."""
        return self.node, await ensure_running(self.server)

    async def relay(self, headers: dict[str, str], limits: Limits, method: str | None, params: dict[str, Any]) -> Any:
        """Send a request of another node's rollout to the server, as it runs now (restarted on
        another port after a death), and return its answer (``shared_relay``)."""
        self.relayed[method or "tools (listed)"] += 1
        state = shared_server._state(self.server)
        port = int(state["port"]) if state else await ensure_running(self.server)
        return await relayed(
            self.server.name, f"http://127.0.0.1:{port}{self.server.path}", headers, limits, method, params
        )

    def status(self) -> dict[str, Any]:
        """What the node records of it (``pid``, ``port``, ``starts``: how often it was started)
        and ``relayed``: the requests it relayed for other nodes, by method."""
        return {**(shared_server._state(self.server) or {}), "relayed": dict(self.relayed)}

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


async def cluster_port(server: SharedToolServer) -> int | _Client:
    """How this process reaches the cluster's ``server`` (``shared_server.CLUSTER``): its
    loopback port on the holder's node, else a client relaying through the holder.

    Raises:
        ToolServerError: it could not be started, or its holder did not answer.
    """
    for attempt in (0, 1):
        try:
            holder = cluster_actor(server)
            node, port = await call(holder.port.remote(), timeout=CALL_TIMEOUT)
            break
        except RayActorError:  # its holder ended (its creator did): the next one holds it anew
            _ACTORS.pop(server.key, None)
            if attempt:
                raise ToolServerError(server.name, "the actor holding the cluster's server died twice") from None
        except TimeoutError:
            raise ToolServerError(server.name, f"its holder did not answer within {CALL_TIMEOUT:g}s") from None
    if node == ray.get_runtime_context().get_node_id():  # the one decision: is the holder here?
        return int(port)
    return relay_client(server, holder)


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
