"""A taskset's tool server shared by the whole cluster (``SharedToolServer(scope="cluster")``)
on the session's Ray cluster: one start for every rollout and process, a restart after its
death, stopped at the end; reached from another node through its holder (relayed over Ray)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from typing import Any, ClassVar

import pytest
from servers import SDK_SERVER

from rollout_ray import (
    OpenAIModel,
    ProgramHarness,
    RolloutSpec,
    SharedToolServer,
    SimulatedModelConfig,
    SimulatedModelServer,
    Task,
    ToolServerError,
    Trace,
    reward,
)
from rollout_ray._core.tools import LocalTools, close_toolsets, open_toolsets
from rollout_ray._record.messages import ToolCall
from rollout_ray._serving.mcp_pool import close_clients

from conftest import process_alive, wait_exit

ray = pytest.importorskip("ray")

from rollout_ray._ray.calls import NAMESPACE, stop_actor  # noqa: E402
from rollout_ray._ray.rollout_client import RolloutActor  # noqa: E402
from rollout_ray._ray.shared_cluster import ClusterServerActor, actor_name, stop_cluster_servers  # noqa: E402
from rollout_ray._ray.shared_relay import RelayClient  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

AGENT = (SDK_SERVER.parents[2] / "examples" / "agent_program.py").read_text()
NAME = f"calc-{uuid.uuid4().hex[:8]}"  # this run's own server: nothing recorded of an earlier run
COMMAND = [sys.executable, str(SDK_SERVER), "http", "{port}"]


class ClusterArith(Task):
    shared: ClassVar[SharedToolServer] = SharedToolServer(NAME, COMMAND, scope="cluster")

    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [cls.shared]

    @reward
    def correct(self, trace: Trace) -> float:
        return float(trace.last_reply == "42")


RELAYED = f"relayed-{uuid.uuid4().hex[:8]}"
BEARER = {"Authorization": "Bearer taskset-secret"}


class RelayedArith(ClusterArith):
    shared: ClassVar[SharedToolServer] = SharedToolServer(RELAYED, COMMAND, scope="cluster", headers=BEARER)


def _status(server: SharedToolServer = ClusterArith.shared) -> dict[str, Any]:
    holder = ray.get_actor(actor_name(server), namespace=NAMESPACE)
    return ray.get(holder.status.remote(), timeout=60)  # type: ignore[no-any-return]


async def _pid_seen_here() -> int:
    """The server's pid as a rollout of this (the driver's) process reaches it."""
    toolset = SharedToolServer(NAME, COMMAND, scope="cluster")
    await open_toolsets([toolset], None)
    try:
        return int((await LocalTools([toolset], None).call(ToolCall("1", "pid", {}))).content)
    finally:
        await close_toolsets([toolset])


def test_one_server_for_the_cluster_restarted_after_its_death_and_stopped_at_the_end() -> None:
    async def rollouts(actor: Any, model: OpenAIModel, n: int) -> list[Trace]:
        harness = ProgramHarness([sys.executable, "agent_program.py"], files={"agent_program.py": AGENT})
        spec = RolloutSpec(ClusterArith({"prompt": "What is 17 + 25?"}), harness, model)
        return list(await asyncio.gather(*(actor.run(spec) for _ in range(n))))

    async def main() -> None:
        actor = RolloutActor.create(capacity=4)
        try:
            async with SimulatedModelServer(SimulatedModelConfig(ttft=0.0)) as server:
                model = OpenAIModel(server.base_url, name="simulated")
                first = await rollouts(actor, model, 4)
                status = _status()
                assert all(t.ok and t.reward == 1.0 for t in first), [t.errors for t in first]
                assert [(r.server, r.name, r.ok) for r in first[0].tool_calls] == [(NAME, "add", True)]
                # one start, reached by the node's tool server and by this process alike
                assert status["starts"] == 1 and await _pid_seen_here() == status["pid"]

                os.kill(status["pid"], 9)  # the server this test had started (through its rollouts)
                await asyncio.to_thread(wait_exit, status["pid"], 30)
                deadline = time.monotonic() + 60  # its holder's watcher restarts it at once
                while _status().get("pid") == status["pid"]:
                    assert time.monotonic() < deadline, "the dead cluster server was not restarted"
                    await asyncio.sleep(0.05)
                again = await rollouts(actor, model, 2)
                restarted = _status()
                assert all(t.ok and t.reward == 1.0 for t in again), [t.errors for t in again]
                assert restarted["starts"] == 2 and restarted["pid"] != status["pid"]
                assert await _pid_seen_here() == restarted["pid"]
        finally:
            await actor.aclose()
            await close_clients()
            await stop_cluster_servers()
        await asyncio.to_thread(wait_exit, restarted["pid"], 30)
        assert not process_alive(restarted["pid"])

    asyncio.run(main())


async def _whoami_through_the_relay(rollout: str, calls: int) -> list[Any]:
    """One rollout of this (the driver's) process: its own toolset, ``calls`` calls at once."""
    toolset = SharedToolServer(RELAYED, COMMAND, scope="cluster", headers=BEARER)
    await open_toolsets([toolset], None)
    try:
        assert isinstance(toolset._client, RelayClient)  # the holder is on "another node"
        tools = LocalTools([toolset], None, caller=rollout)
        outcomes = await asyncio.gather(*(tools.call(ToolCall(str(n), "whoami", {})) for n in range(calls)))
        pid = int((await tools.call(ToolCall("pid", "pid", {}))).content)
    finally:
        await close_toolsets([toolset])
    return [*(json.loads(o.content) for o in outcomes), pid]


async def _bounds_through_the_relay() -> None:
    """The toolset's bounds hold through the relay: an answer over ``max_message`` or later than
    ``timeout`` fails the call with ``ToolServerError`` naming the server (as on the holder's node)."""
    toolset = SharedToolServer(RELAYED, COMMAND, scope="cluster", headers=BEARER, max_message=8000, timeout=1.0)
    await open_toolsets([toolset], None)
    try:
        tools = LocalTools([toolset], None, caller="bounded")
        with pytest.raises(ToolServerError, match=f"{RELAYED}.*max_message"):
            await tools.call(ToolCall("big", "echo", {"text": "x" * 20000}))
        with pytest.raises(ToolServerError, match=f"{RELAYED}.*no answer within 1s"):
            await tools.call(ToolCall("hung", "hang", {}))
    finally:
        await close_toolsets([toolset])


def test_from_another_node_calls_are_relayed_by_the_holder_with_their_identity_and_after_a_restart() -> None:
    # The holder says it is on another node, so every opening on this one-node cluster (this
    # process, the node's tool server) takes the relay, as it would on a second node.
    holder = ClusterServerActor.options(name=actor_name(RelayedArith.shared), namespace=NAMESPACE).remote(
        RelayedArith.shared, node="another-node"
    )

    async def main() -> None:
        actor = None
        try:
            calls = [7, 7, 6, 6, 6, 6, 6, 6]  # 50 calls from 8 rollouts, all in flight at once
            answers = await asyncio.gather(*(_whoami_through_the_relay(f"rollout-{i}", n) for i, n in enumerate(calls)))
            status = _status(RelayedArith.shared)
            for i, (n, seen) in enumerate(zip(calls, answers, strict=True)):
                # each call reached the server as its rollout's, with the taskset's bearer: none dropped
                assert seen[:-1] == [{"rollout": f"rollout-{i}", "authorization": BEARER["Authorization"]}] * n
                assert seen[-1] == status["pid"]
            assert status["starts"] == 1 and status["relayed"]["tools/call"] == 50 + len(calls)
            await _bounds_through_the_relay()

            os.kill(status["pid"], 9)  # the server this test had started (through its holder)
            await asyncio.to_thread(wait_exit, status["pid"], 30)
            deadline = time.monotonic() + 60  # its holder's watcher restarts it at once
            while _status(RelayedArith.shared).get("pid") == status["pid"]:
                assert time.monotonic() < deadline, "the dead cluster server was not restarted"
                await asyncio.sleep(0.05)
            # real rollouts, served by the node's tool server, reach the new server through the relay
            actor = RolloutActor.create(capacity=2)
            harness = ProgramHarness([sys.executable, "agent_program.py"], files={"agent_program.py": AGENT})
            async with SimulatedModelServer(SimulatedModelConfig(ttft=0.0)) as server:
                model = OpenAIModel(server.base_url, name="simulated")
                spec = RolloutSpec(RelayedArith({"prompt": "What is 17 + 25?"}), harness, model)
                again = await asyncio.gather(actor.run(spec), actor.run(spec))
            assert all(t.ok and t.reward == 1.0 for t in again), [t.errors for t in again]
            assert [(r.server, r.name, r.ok) for r in again[0].tool_calls] == [(RELAYED, "add", True)]
            restarted = _status(RelayedArith.shared)
            assert restarted["starts"] == 2 and restarted["pid"] != status["pid"]
            assert restarted["relayed"]["tools/call"] == 50 + len(calls) + 2 + 2  # and the bounded two
            assert (await _whoami_through_the_relay("after", 1))[-1] == restarted["pid"]
        finally:
            if actor is not None:
                await actor.aclose()
            await close_clients()
            await stop_cluster_servers()
            await stop_actor(holder)  # stopped here too if this process never reached it

    asyncio.run(main())
