"""A worker node's raylet frozen mid-run (SIGSTOP), then resumed (run by tests/faults/test_hangs.py).

Runs as its own process: a ``ray.cluster_utils.Cluster`` needs its own ``ray.init``, and the
test session already holds one. Builds a head node (resource ``node_a``) and a worker node
(``node_b``), runs a Driver on a RayExecutor with one rollout actor on each node, waits until
every rollout waits at a gate, freezes node B's raylet for FREEZE seconds (resumed by pid in a
``finally``, whatever happens), records what the run showed, and opens the gate once the
driver retried the rollouts of node B or 5 s passed. Prints one JSON line of facts: when the
driver turned B's rollouts into retries (``None``: never), whether the run ended while the
raylet was still frozen, the rows. Every process it started is gone when it exits
(``cluster.shutdown()``; node B's are checked).

``HEALTH`` is ``default`` (Ray's own health checks: 5 missed checks of up to 10 s each before
a node is dead) or ``strict`` (3 missed checks of 0.2 s: dead within a second).

    python raylet_freeze.py TASKS FREEZE HEALTH
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

import ray
from ray.cluster_utils import Cluster

from rollout_ray import ChatHarness, Task, Trace, reward
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._ray.ray_executor import RayExecutor
from rollout_ray.testing import ScriptedModel


class Echo(Task):
    @reward
    def said_four(self, trace: Trace) -> float:
        return float(trace.last_reply == "4")


class Gate:
    """Rollouts report where they run and wait here until the script opens the gate."""

    def __init__(self) -> None:
        self.arrived: list[tuple[str, str, int]] = []
        self._open = asyncio.Event()
        self._changed = asyncio.Condition()

    async def arrive(self, node_id: str, rollout_id: str, pid: int) -> None:
        async with self._changed:
            self.arrived.append((node_id, rollout_id, pid))
            self._changed.notify_all()
        await self._open.wait()

    async def until(self, n: int) -> list[tuple[str, str, int]]:
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.arrived) >= n)
        return list(self.arrived)

    def open(self) -> None:
        self._open.set()


class Gated(ChatHarness):
    async def launch(self, ctx: Any) -> Any:
        gate = ray.get_actor("gate", namespace="hang-suite")
        await gate.arrive.remote(ray.get_runtime_context().get_node_id(), ctx.trace.id, os.getpid())
        return await super().launch(ctx)


def node_with(resource: str) -> str:
    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"])


def status_line(status: dict[str, Any]) -> str:
    """What ``rollout-ray ctl RUN status`` showed (``Driver.live_status``), in a table cell."""
    phases = ", ".join(f"{n} {phase}" for phase, n in status["phases"].items() if n) or "nothing in flight"
    p = status["progress"]
    return f"ctl status: {phases}; stalled {status['stalled']}; done {p['done']}/{p['total']}, retried {p['retried']}"


async def run(raylet: int, n_tasks: int, freeze: float) -> dict[str, Any]:
    node_b = node_with("node_b")
    gate = (
        ray.remote(Gate)
        .options(name="gate", namespace="hang-suite", resources={"node_a": 0.01}, max_concurrency=1000)
        .remote()
    )
    placement = [{"resources": {"node_a": 0.01}}, {"resources": {"node_b": 0.01}}]
    executor = RayExecutor(actors=2, capacity=n_tasks, actor_options=placement)
    facts: dict[str, Any] = {"raylet": raylet}
    async with executor:
        tasks = [Echo({"idx": i, "prompt": f"question {i}"}) for i in range(n_tasks)]
        driver = Driver(
            tasks,
            Gated(retries=0),
            ScriptedModel(default="4"),
            executor=executor,
            config=EvalConfig(samples_per_task=1, max_in_flight=n_tasks, max_infra_retries=1),
        )
        running = asyncio.ensure_future(driver.arun())
        arrived = await gate.until.remote(n_tasks)
        on_b = [(rid, pid) for node, rid, pid in arrived if node == node_b]
        facts["on_b_pids"] = sorted({pid for _, pid in on_b})
        os.kill(raylet, signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            await asyncio.sleep(1.0)  # the hang holds: what does the run show?
            # asked meanwhile, answered when the actors' polls return (each bounded by 5 s)
            status = asyncio.ensure_future(driver.live_status())
            while driver.progress.retried < len(on_b) and time.monotonic() - frozen < 5:
                await asyncio.sleep(0.05)
            facts["detected"] = time.monotonic() - frozen if driver.progress.retried >= len(on_b) else None
            facts["meanwhile"] = status_line(await asyncio.wait_for(status, 30))
            await gate.open.remote()
            result = await asyncio.wait_for(running, 90)
            facts["ended_frozen"] = time.monotonic() - frozen < freeze
            await asyncio.sleep(max(0.0, freeze - (time.monotonic() - frozen)))
        finally:
            os.kill(raylet, signal.SIGCONT)  # by pid: the raylet this script froze
        facts["frozen_for"] = time.monotonic() - frozen
    rows = result.samples.select(["rollout_id", "group_id", "sample_idx", "ok", "attempt", "error_type"]).to_pylist()
    facts.update(rows=rows, on_b=len(on_b), status=result.status, replaced=executor.replaced)
    return facts


STRICT = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 200,
    "health_check_timeout_ms": 200,
    "health_check_failure_threshold": 3,
}


def main() -> None:
    n_tasks, freeze, health = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    system = STRICT if health == "strict" else {}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"node_a": 1},
            "include_dashboard": False,
            "_system_config": system,
        },
    )
    facts: dict[str, Any] = {}
    try:
        worker = cluster.add_node(num_cpus=1, resources={"node_b": 1})
        raylet = worker.all_processes["raylet"][0].process.pid
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        cluster.wait_for_nodes()
        facts = asyncio.run(asyncio.wait_for(run(raylet, n_tasks, freeze), 150))
    finally:
        ray.shutdown()
        cluster.shutdown()
    deadline = time.monotonic() + 10
    left = [facts["raylet"], *facts["on_b_pids"]]
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if _alive(pid)]
        time.sleep(0.05)
    facts["leftover"] = left
    print("FACTS " + json.dumps(facts), flush=True)  # Ray writes raylet logs to stdout too


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


if __name__ == "__main__":
    main()
