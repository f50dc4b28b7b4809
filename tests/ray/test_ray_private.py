"""Ray: private and on loopback by default; a taskset of the driver's own ships itself; a
spec that cannot travel fails its rollout, not the run (issue 10 §6, §7)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from rollout_ray import ChatHarness, Task, Trace, reward
from rollout_ray._driver.driver import Driver
from rollout_ray.testing import ScriptedModel

ray = pytest.importorskip("ray")

from rollout_ray._ray.ray_executor import RayExecutor  # noqa: E402

pytestmark = pytest.mark.security  # who can reach the cluster, and what a driver ships to it

PROBE = textwrap.dedent("""
    import asyncio, json, os, ray
    from rollout_ray._ray.ray_executor import RayExecutor

    def ray_processes():
        # The commands of this Ray's processes (their command lines name its temp dir).
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = open(f"/proc/{pid}/cmdline").read().split(chr(0))
            except OSError:
                continue
            if any(os.environ["RAY_TMPDIR"] in a for a in argv):
                found.append(" ".join(argv)[:300])
        return found

    async def main():
        async with RayExecutor(actors=1, capacity=1):
            nodes = ray.nodes()
            print(json.dumps({"gcs": ray.get_runtime_context().gcs_address,
                              "node": nodes[0]["NodeManagerAddress"], "nodes": len(nodes),
                              "processes": ray_processes()}))

    asyncio.run(main())
""")


@pytest.mark.slow
def test_without_an_address_a_private_ray_on_loopback_is_started(report: Any) -> None:
    """Another cluster named in the machine's ray_current_cluster file is never joined; the
    monitor, log monitor and dashboard API server are not started (``LEAN_SKIPS``)."""
    temp = tempfile.mkdtemp(prefix="rr", dir="/tmp")  # short: Ray's socket paths are bounded
    os.makedirs(os.path.join(temp, "ray"))
    with open(os.path.join(temp, "ray", "ray_current_cluster"), "w") as f:
        f.write("127.0.0.1:1")  # "another user's cluster": ray.init() would try to join it
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    env["RAY_TMPDIR"] = temp
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["gcs"].startswith("127.0.0.1:") and facts["gcs"] != "127.0.0.1:1"
    assert facts["node"] == "127.0.0.1" and facts["nodes"] == 1
    # Lean: the pieces a private local Ray never uses are not started (the core ones are).
    processes = facts["processes"]
    assert any("gcs_server" in p for p in processes) and any("raylet" in p for p in processes), processes
    for unused in ("autoscaler/_private/monitor.py", "log_monitor.py", "dashboard/dashboard.py"):
        assert not any(unused in p for p in processes), (unused, processes)
    report(
        "10§7 no address",
        "a cluster named in ray_current_cluster",
        "private Ray on 127.0.0.1 started",
        "not joined",
        time.monotonic() - t0,
    )


def test_the_registration_wait_returns_once_the_gcs_lists_the_node(ray_cluster: Any) -> None:
    """lean_head's wait for the new node polls the GCS (Ray's own looks once a second) and
    then leaves the answer to Ray's call; for a node that never registers it gives up at its
    timeout and Ray's call decides. Outside ``ray.init`` Ray's function is Ray's again."""
    from ray._private import services

    from rollout_ray._ray.head import _after_registration, lean_head

    gcs = ray._private.worker.global_worker.node.gcs_address
    node = ray.get_runtime_context().get_node_id()
    asked: list[tuple[str, str]] = []
    wait = _after_registration(lambda address, node_id: asked.append((address, node_id)) or "node info")
    assert wait(gcs, node) == "node info" and asked == [(gcs, node)]
    t0 = time.monotonic()
    never = _after_registration(lambda address, node_id: "Ray decides", timeout=0.3)
    assert never(gcs, "ff" * 28) == "Ray decides"
    assert 0.3 <= time.monotonic() - t0 < 30  # its timeout, then no hang
    original = services.get_node
    with lean_head():
        assert services.get_node is not original
    assert services.get_node is original


class Said4(Task):
    @reward
    def four(self, trace: Trace) -> float:
        return float(trace.last_reply == "4")


USER_MODULE = textwrap.dedent("""
    from rollout_ray import Task, Trace, reward

    class UserTask(Task):
        @reward
        def four(self, trace: Trace) -> float:
            return float(trace.last_reply == "4")
""")


def _user_module(folder: Path) -> Any:
    """A taskset module of the driver's own, in a folder the workers do not have on sys.path."""
    name = f"user_tasks_{uuid.uuid4().hex[:8]}"
    path = folder / f"{name}.py"
    path.write_text(USER_MODULE)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.ray
def test_a_taskset_module_of_the_driver_ships_itself(ray_cluster: Any, tmp_path: Path, report: Any) -> None:
    module = _user_module(tmp_path)

    async def main() -> Any:
        async with RayExecutor(actors=1, capacity=4) as executor:
            tasks = [module.UserTask({"idx": i, "prompt": f"q{i}"}) for i in range(4)]
            return await Driver(tasks, ChatHarness(), ScriptedModel(default="4"), executor=executor).arun()

    t0 = time.monotonic()
    result = asyncio.run(main())
    rows = result.samples.to_pylist()
    assert [r["ok"] for r in rows] == [True] * 4 and {r["reward"] for r in rows} == {1.0}
    report(
        "10§7 taskset in its own module",
        "library API, module outside the workers' path",
        "shipped by value",
        "0 (was ModuleNotFoundError for the run)",
        time.monotonic() - t0,
    )


class Unpicklable(Said4):
    def __init__(self, data: Any) -> None:
        super().__init__(data)
        self.lock = threading.Lock()  # cannot be pickled: this spec cannot reach an actor


@pytest.mark.ray
def test_a_spec_that_cannot_travel_fails_its_rollout_not_the_run(ray_cluster: Any, report: Any) -> None:
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])

    async def main() -> Any:
        async with RayExecutor(actors=1, capacity=4) as executor:
            tasks = [
                Said4({"idx": 0, "prompt": "q0"}),
                Unpicklable({"idx": 1, "prompt": "q1"}),
                Said4({"idx": 2, "prompt": "q2"}),
            ]
            return await Driver(tasks, ChatHarness(), ScriptedModel(default="4"), executor=executor).arun()

    t0 = time.monotonic()
    result = asyncio.run(main())
    rows = {r["task_idx"]: r for r in result.samples.to_pylist()}
    assert rows[0]["ok"] and rows[2]["ok"]
    assert not rows[1]["ok"] and rows[1]["error_type"] == "TypeError" and "lock" in rows[1]["error_message"]
    assert rows[1]["attempt"] == 0  # not an infrastructure loss: not retried
    report(
        "10§6 unpicklable task",
        "a task holding a lock",
        "its rollout failed as data",
        "0 others",
        time.monotonic() - t0,
    )


def test_error_class_knows_infrastructure_losses() -> None:
    from rollout_ray._errors import InfrastructureLost, ProviderError, error_class

    assert error_class("InfrastructureLost") is InfrastructureLost
    assert error_class("OverlongPromptError") is not None and issubclass(
        error_class("OverlongPromptError"), ProviderError
    )
    assert error_class("KeyError") is KeyError and error_class("NoSuchError") is None
