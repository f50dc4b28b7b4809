"""cluster/: the local 3-node cluster end to end, and the KubeRay / ray up configurations.

The end-to-end test runs everything in subprocesses (the cluster, the eval driver, a probe
driver) so it never touches the session's Ray (``ray_cluster`` in conftest), and it stops
only the processes of the cluster it started.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"
SCRIPT = CLUSTER / "local_cluster.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("local_cluster", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _clean_env() -> dict[str, str]:
    """This environment without anything that points a Ray client somewhere else."""
    env = dict(os.environ)
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    return env


def _run(argv: list[str], *, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


_PROBE = """
import sys, ray
ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False)
names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
         if a.get("namespace") == "rollout_ray" and a["name"].startswith("interception:")]
print(len(names))
"""

_NO_TOKEN = """
import sys
from ray._raylet import GcsClient
try:
    GcsClient(address=sys.argv[1]).get_all_node_info(timeout=10)
except Exception as e:
    print(type(e).__name__)
else:
    print("ACCEPTED")
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_eval_on_local_three_node_cluster(tmp_path: Path) -> None:
    lc = _script()
    state_dir = tmp_path / "cluster"
    env = _clean_env()
    started = time.monotonic()
    state: dict[str, Any] | None = None
    seen: set[int] = set()
    phases: dict[str, float] = {}

    def lap(name: str) -> None:
        phases[name] = round(time.monotonic() - started - sum(phases.values()), 1)

    try:
        start = _run([sys.executable, str(SCRIPT), "start", "--dir", str(state_dir)], env=env, timeout=150)
        state = lc.load_state(state_dir)
        lap("start")
        assert start.returncode == 0, start.stdout + start.stderr
        assert state is not None and state["address"] in start.stdout
        assert state["auth"]
        assert stat.S_IMODE(os.stat(state["token_file"]).st_mode) == 0o600
        seen.update(lc.cluster_pids(state))
        assert {n["pid"] for n in state["nodes"].values()} <= seen

        # Token auth is enforced: a client without the token is refused.
        refused = _run([sys.executable, "-c", _NO_TOKEN, state["address"]], env=env, timeout=60)
        assert refused.stdout.strip() == "AuthenticationError", refused.stdout + refused.stderr

        client = {**env, **lc.client_env(state)}
        out = tmp_path / "run"
        evaluated = _run(
            [
                sys.executable,
                "-m",
                "rollout_ray",
                "eval",
                "examples/arith.py",
                "--address",
                state["address"],
                "--limit",
                "4",
                "--samples",
                "2",
                "--out",
                str(out),
            ],
            env=client,
            timeout=150,
        )
        lap("eval")
        assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
        assert "rollouts 8  ok 8  failed 0" in evaluated.stdout, evaluated.stdout
        (warmup,) = [s for s in evaluated.stderr.splitlines() if s.startswith("warmup ")]
        assert ": Ray, 3 rollout actors " in warmup, warmup  # by default one per CPU: 3 nodes of 1

        from rollout_ray._record.store import read_run

        assert read_run(str(out)).num_rows == 8
        # The Trace does not record its node; the per-node interception actors do show where
        # rollout actors ran. Reported, not asserted (SPREAD of zero-CPU actors, see README).
        probe = _run([sys.executable, "-c", _PROBE, state["address"]], env=client, timeout=60)
        assert probe.returncode == 0, probe.stdout + probe.stderr
        print(f"nodes with rollouts: {probe.stdout.strip()} of 3")
        seen.update(lc.cluster_pids(state))  # now with workers and actors
    finally:
        if state is not None or (state_dir / "state.json").exists():
            lap("checks")
            stopped = _run([sys.executable, str(SCRIPT), "stop", "--dir", str(state_dir)], env=env, timeout=60)
            lap("stop")
            state = state or lc.load_state(state_dir)
            assert state is not None
            try:
                assert stopped.returncode == 0, stopped.stdout + stopped.stderr
                assert [p for p in sorted(seen) if lc.alive(p)] == []
                assert lc.cluster_pids(state) == []
                # A later bare ray.init() on this machine must not try to join the dead cluster.
                default = Path(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp")
                current = default / "ray" / "ray_current_cluster"
                assert not (current.exists() and current.read_text().strip() == state["address"])
            finally:
                if not state["temp_root"].startswith(str(tmp_path)):
                    shutil.rmtree(state["temp_root"], ignore_errors=True)
    print(f"local cluster test: {time.monotonic() - started:.1f}s {phases}")


def test_token_file_is_private_and_random(tmp_path: Path) -> None:
    lc = _script()
    a, b = tmp_path / "a", tmp_path / "b"
    lc.write_token(a)
    lc.write_token(b)
    assert stat.S_IMODE(os.stat(a).st_mode) == 0o600
    assert len(a.read_text()) == 64 and a.read_text() != b.read_text()
    with pytest.raises(FileExistsError):
        lc.write_token(a)


def test_cluster_pids_finds_nothing_for_an_unknown_cluster() -> None:
    lc = _script()
    state = {"id": "0" * 32, "temp_root": "/nonexistent/rrc", "nodes": {"head": {"pid": os.getpid()}}}
    assert lc.cluster_pids(state) == []  # this pytest is not a `ray start --block`


# -- the YAML configurations ---------------------------------------------------------------


def _yaml(name: str) -> Any:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load((CLUSTER / name).read_text())


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_kuberay_manifest() -> None:
    doc = _yaml("kuberay.yaml")
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayCluster"
    head = doc["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"
    groups = [head, *doc["spec"]["workerGroupSpecs"]]
    assert len(groups) >= 2
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            env = _env(container)
            assert env["RAY_AUTH_MODE"] == "token"
            assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]  # from a Secret, never inline
            assert container["resources"]["requests"] and container["resources"]["limits"]
            assert all(p["containerPort"] != 8265 for p in container.get("ports", []))
            # The default sandbox's needs (issue 32 §2), held only inside the pod's user namespace.
            security = container["securityContext"]
            assert security["procMount"] == "Unmasked" and "SYS_ADMIN" in security["capabilities"]["add"]
            assert security["seccompProfile"]["type"] == security["appArmorProfile"]["type"] == "Unconfined"
            assert not security.get("privileged")
        assert group["template"]["spec"]["hostUsers"] is False
    dockerfile = (CLUSTER / "Dockerfile").read_text()
    assert "pip install" in dockerfile and "COPY" in dockerfile and "rollout_ray" in dockerfile


def test_ray_up_config() -> None:
    doc = _yaml("ray-up.yaml")
    setup = " ".join(doc["setup_commands"])
    assert "pip install" in setup and "rollout_ray" in setup
    assert any(src == "." for src in doc["file_mounts"].values())  # the repository, to every node
    head = " ".join(doc["head_start_ray_commands"])
    worker = " ".join(doc["worker_start_ray_commands"])
    assert "RAY_AUTH_MODE=token ray start --head" in head and "--dashboard-host=127.0.0.1" in head
    assert "RAY_AUTH_MODE=token ray start --address" in worker
    assert "~/.ray/auth_token" in doc["file_mounts"]
    try:
        from ray.autoscaler._private.util import fillout_defaults, validate_config
    except ImportError:  # pragma: no cover - Ray's schema check is a bonus
        return
    validate_config(fillout_defaults(doc))  # Ray's own cluster-config schema
