"""Node loss mid-run, on a simulated two-node cluster (run by tests/test_faults.py).

Runs as its own process: a ``ray.cluster_utils.Cluster`` needs its own ``ray.init``, and the
test session already holds one. Builds a head node (custom resource ``node_a``) and a worker
node (``node_b``), runs a Driver on a RayExecutor with one rollout actor pinned (softly) to
each node, waits until every first-wave rollout is running, removes the worker node, waits
until the driver has turned the lost rollouts into retries, lets every rollout finish, and
prints one JSON line of facts for the test to check. Every process it started is gone when
it exits (``cluster.shutdown()``; the runtime hosts' guardians are waited for).

    python node_loss.py TASKS SAMPLES
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import sys
import time
from typing import Any

import ray
from ray.cluster_utils import Cluster

from rollout_ray import ChatHarness, Task, Trace, reward
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._ray.ray_executor import RayExecutor
from rollout_ray.testing import ScriptedModel

# Node death detected in ~1 s instead of Ray's default ~30 s (health checks every 3 s, 5 misses).
SYSTEM_CONFIG = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 200,
    "health_check_timeout_ms": 200,
    "health_check_failure_threshold": 3,
}


class Echo(Task):
    @reward
    def said_four(self, trace: Trace) -> float:
        return float(trace.last_reply == "4")


class Gate:
    """Rollouts report where they run and wait here until the script opens the gate."""

    def __init__(self) -> None:
        self.arrived: list[tuple[str, str]] = []
        self._open = asyncio.Event()
        self._changed = asyncio.Condition()

    async def arrive(self, node_id: str, rollout_id: str) -> None:
        async with self._changed:
            self.arrived.append((node_id, rollout_id))
            self._changed.notify_all()
        await self._open.wait()

    async def until(self, n: int) -> list[tuple[str, str]]:
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.arrived) >= n)
        return list(self.arrived)

    def open(self) -> None:
        self._open.set()


class Gated(ChatHarness):
    async def launch(self, ctx: Any) -> Any:
        gate = ray.get_actor("gate", namespace="fault-suite")
        await gate.arrive.remote(ray.get_runtime_context().get_node_id(), ctx.trace.id)
        return await super().launch(ctx)


def node_with(resource: str) -> str:
    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"])


async def host_facts(executor: RayExecutor) -> list[dict[str, Any]]:
    """Root, guardian pid and node of every rollout actor's runtime host."""
    facts = []
    for actor in executor._pool:
        if actor is None:
            continue
        host = await actor.actor.runtime_actor.remote()
        root, guardian = await host.__ray_call__.remote(lambda h: (h.root, h.guardian_pid()))
        facts.append({"root": root, "guardian": guardian, "node": await actor.node_id()})
    return facts


async def until(predicate: Any, timeout: float) -> None:
    """Poll a driver counter (another coroutine of this loop updates it) with a deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.01)


async def run(cluster: Cluster, worker: Any, n_tasks: int, samples: int) -> dict[str, Any]:
    node_a, node_b = node_with("node_a"), node_with("node_b")
    gate = (
        ray.remote(Gate)
        .options(name="gate", namespace="fault-suite", resources={"node_a": 0.01}, max_concurrency=1000)
        .remote()
    )
    # One actor per node; a replacement is spread (RayExecutor's default), so it starts on
    # node A once node B is gone.
    placement = [{"resources": {"node_a": 0.01}}, {"resources": {"node_b": 0.01}}]
    executor = RayExecutor(actors=2, capacity=n_tasks * samples, actor_options=placement)
    total = n_tasks * samples
    async with executor:
        tasks = [Echo({"idx": i, "prompt": f"question {i}"}) for i in range(n_tasks)]
        driver = Driver(
            tasks,
            Gated(retries=0),
            ScriptedModel(default="4"),
            executor=executor,
            config=EvalConfig(samples_per_task=samples, max_in_flight=total, max_infra_retries=1),
        )
        running = asyncio.ensure_future(driver.arun())
        arrived = await gate.until.remote(total)
        hosts = await host_facts(executor)
        on_b = sum(1 for node, _ in arrived if node == node_b)
        t0 = time.monotonic()
        cluster.remove_node(worker, allow_graceful=False)
        await until(lambda: driver.progress.retried >= on_b, 30)
        detected = time.monotonic() - t0
        await gate.open.remote()
        result = await asyncio.wait_for(running, 60)
        elapsed = time.monotonic() - t0
        hosts += await host_facts(executor)  # the replacement's host too
    rows = result.samples.select(
        ["rollout_id", "group_id", "sample_idx", "ok", "attempt", "num_errors", "error_type", "attempts"]
    ).to_pylist()
    return {
        "node_a": node_a,
        "node_b": node_b,
        "arrived": arrived,
        "rows": rows,
        "status": result.status,
        "detected": detected,
        "elapsed": elapsed,
        "replaced": executor.replaced,
        "hosts": hosts,
    }


def wait_exit(pid: int, timeout: float) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def main() -> None:
    n_tasks, samples = int(sys.argv[1]), int(sys.argv[2])
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"node_a": 1},
            "include_dashboard": False,
            "_system_config": SYSTEM_CONFIG,
        },
    )
    try:
        worker = cluster.add_node(num_cpus=1, resources={"node_b": 1})
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        cluster.wait_for_nodes()
        facts = asyncio.run(asyncio.wait_for(run(cluster, worker, n_tasks, samples), 90))
    finally:
        ray.shutdown()
        cluster.shutdown()
    facts["leftover"] = [h for h in facts["hosts"] if not wait_exit(h["guardian"], 10) or os.path.exists(h["root"])]
    print("FACTS " + json.dumps(facts), flush=True)  # Ray writes raylet logs to stdout too


if __name__ == "__main__":
    main()
