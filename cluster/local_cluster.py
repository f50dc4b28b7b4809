#!/usr/bin/env python3
"""A three-node Ray cluster on one machine: a head and two workers, with token auth.

    python cluster/local_cluster.py start  [--dir DIR] [--cpus N] [--dashboard] [--no-auth]
    python cluster/local_cluster.py status [--dir DIR]
    python cluster/local_cluster.py stop   [--dir DIR]
    python cluster/local_cluster.py env    [--dir DIR]   # shell exports for a client
    python cluster/local_cluster.py address [--dir DIR]  # just the address

Each node is its own ``ray start --block`` process (its own raylet, its own temp dir) with a
custom resource naming it: ``{"node_head": 1}``, ``{"node_a": 1}``, ``{"node_b": 1}``. Every
process of the cluster — the three ``ray start`` supervisors, GCS, raylets, agents, workers,
actors — inherits the variable ``ROLLOUT_RAY_LOCAL_CLUSTER=<cluster id>``; ``stop`` signals
exactly this cluster's processes (that variable, this cluster's temp dir on the command line,
or descent from the recorded ``ray start`` PIDs — see ``cluster_pids``), never any other Ray
on the machine. It never runs ``ray stop``, which would end every Ray of the user.

State lives in DIR (default ``/tmp/rollout-ray-cluster-<uid>``): ``state.json`` (address,
PIDs, cluster id), ``auth_token`` (mode 0600), ``logs/<node>.log``, and the nodes' Ray temp
dirs (under DIR/ray if that path is short enough for Ray's Unix sockets, else a short
directory under /tmp recorded in ``state.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

MARKER = "ROLLOUT_RAY_LOCAL_CLUSTER"
NODES = ("head", "a", "b")
# Ray puts Unix sockets at <temp>/<session_...>/sockets/plasma_store (≈ 64 chars past the
# node's temp dir) and refuses paths over 107 bytes; keep the root of the temp dirs short.
MAX_TEMP_ROOT = 36
START_TIMEOUT = 90.0


def default_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"rollout-ray-cluster-{os.getuid()}"


def ray_executable() -> str:
    """The ``ray`` command of the Python running this script, else the one on PATH.

    Next to ``sys.executable`` first: a venv used without being activated (``.venv/bin/python
    cluster/local_cluster.py start``) has its ``ray`` there and not on PATH.
    """
    beside = os.path.join(os.path.dirname(sys.executable), "ray")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("ray")
    if found is None:
        raise SystemExit(f"cannot find the `ray` command next to {sys.executable} or on PATH; "
                         "install the package (pip install -e .) into this Python")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_token(path: Path) -> None:
    """A fresh 256-bit token, created 0600 (never readable by others, even for an instant)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))


def client_env(state: dict[str, Any]) -> dict[str, str]:
    """The variables a client (driver, ``ray`` CLI) needs to talk to this cluster."""
    if state["auth"]:
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": state["token_file"]}
    return {"RAY_AUTH_MODE": "disabled"}


def cluster_env(state: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    # RAY_AUTH_TOKEN beats RAY_AUTH_TOKEN_PATH, and RAY_ADDRESS would redirect `ray start`.
    for name in ("RAY_AUTH_TOKEN", "RAY_ADDRESS"):
        env.pop(name, None)
    env.update(client_env(state))
    env[MARKER] = state["id"]
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # No Serve here: SIGTERM ends a node at once instead of draining it for 30 s.
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
    # `ray start --head` also writes its address to <RAY_TMPDIR or /tmp>/ray/ray_current_cluster,
    # where every later bare `ray.init()` on the machine would find it and try to join this
    # cluster, even once it is stopped (a 60 s hang). Keep that file in our own temp root.
    if state.get("temp_root"):
        env["RAY_TMPDIR"] = state["temp_root"]
    return env


def load_state(d: Path) -> dict[str, Any] | None:
    try:
        return json.loads((d / "state.json").read_text())
    except FileNotFoundError:
        return None


def save_state(d: Path, state: dict[str, Any]) -> None:
    tmp = d / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(d / "state.json")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _processes() -> dict[int, tuple[int, bytes, bytes]]:
    """pid -> (ppid, cmdline, environ) of every live process this user can read."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except (OSError, IndexError):  # gone, or another user's
            continue
        table[int(entry)] = (int(fields[2]), cmdline, environ)
    return table


def cluster_pids(state: dict[str, Any]) -> list[int]:
    """Every live process of this cluster, found three ways (any one suffices):

    its environment carries ``ROLLOUT_RAY_LOCAL_CLUSTER=<id>`` (inherited by everything the
    nodes start — but Ray's ``setproctitle`` can overwrite a process's visible environment),
    its command line names this cluster's temp dir, or it descends from a process found so
    far or from a recorded ``ray start`` PID.
    """
    needle = f"{MARKER}={state['id']}".encode()
    temp_root = state["temp_root"].encode() + b"/"
    me = os.getpid()
    table = _processes()
    found = {pid for pid, (_, cmdline, environ) in table.items()
             if needle in environ.split(b"\0") or temp_root in cmdline}
    # A recorded PID counts only while it is still a `ray start --block` (not a reused PID).
    found |= {n["pid"] for n in state["nodes"].values()
              if n["pid"] in table and b"start\0--block" in table[n["pid"]][1]}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.discard(me)
    return sorted(found)


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _gcs_nodes(address: str, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Alive nodes as the GCS sees them (imports ray; the auth variables must be set)."""
    from ray._raylet import GcsClient

    client = GcsClient(address=address)
    nodes = []
    for info in client.get_all_node_info(timeout=timeout).values():
        if info.state == 0:  # ALIVE
            nodes.append({"ip": info.node_manager_address,
                          "resources": dict(info.resources_total)})
    return nodes


def _wait_for(predicate: Any, timeout: float, what: str, procs: dict[str, subprocess.Popen[bytes]]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"node {name} exited with {proc.returncode} while waiting for {what}")
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def _new_state(d: Path, auth: bool) -> dict[str, Any]:
    """Create the state dir, pick the nodes' temp root, write a fresh token: the cluster's initial state."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "logs").mkdir(exist_ok=True)
    temp_root = d / "ray"
    if len(str(temp_root)) > MAX_TEMP_ROOT:
        temp_root = Path(tempfile.mkdtemp(prefix="rrc-", dir="/tmp"))
    token_file = d / "auth_token"
    if auth:
        if token_file.exists():
            token_file.unlink()
        write_token(token_file)
    return {
        "id": uuid.uuid4().hex,
        "dir": str(d),
        "temp_root": str(temp_root),
        "auth": auth,
        "token_file": str(token_file),
        "address": None,
        "dashboard": None,
        "nodes": {},
    }


def _head_flags(args: argparse.Namespace, state: dict[str, Any]) -> list[str]:
    """The head's own ``ray start`` flags: its GCS port, and the dashboard on 127.0.0.1 or off."""
    flags = ["--head", "--port", str(free_port())]
    if args.dashboard:
        state["dashboard"] = f"http://127.0.0.1:{(dash_port := free_port())}"
        flags += ["--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
                  "--dashboard-port", str(dash_port)]
    else:
        flags += ["--include-dashboard", "false"]
    return flags


def _wait_for_registration(state: dict[str, Any], procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """Wait until the GCS lists all three nodes (by their ``node_<name>`` resources)."""
    address = state["address"]
    # _gcs_nodes is a client of the cluster: it needs the cluster's auth variables.
    os.environ.update(client_env(state))
    os.environ.pop("RAY_AUTH_TOKEN", None)

    def all_up() -> bool:
        try:
            names = {k for n in _gcs_nodes(address) for k in n["resources"] if k.startswith("node_")}
        except Exception:  # noqa: BLE001 - not up yet, whatever the error
            return False
        return names >= {f"node_{n}" for n in NODES}

    _wait_for(all_up, START_TIMEOUT, "all three nodes to register", procs)


def _launch_nodes(args: argparse.Namespace, d: Path, state: dict[str, Any]) -> None:
    """Launch the head, wait for its address, launch the workers, wait until all three registered."""
    env = cluster_env(state)
    ray = ray_executable()
    temp_root = Path(state["temp_root"])
    common = ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", str(args.cpus),
              "--object-store-memory", str(args.object_store_mb * 1024 * 1024),
              "--disable-usage-stats"]
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def launch(name: str, extra: list[str]) -> None:
        node_temp = temp_root / name
        argv = [ray, "start", *common, *extra,
                "--resources", json.dumps({f"node_{name}": 1}),
                "--temp-dir", str(node_temp),
                "--dashboard-agent-listen-port", str(free_port())]
        with open(d / "logs" / f"{name}.log", "wb") as log:
            procs[name] = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        state["nodes"][name] = {"pid": procs[name].pid, "temp_dir": str(node_temp)}
        save_state(d, state)  # PIDs on disk at once, so `stop` works even if start fails

    head_flags = _head_flags(args, state)
    address_file = temp_root / "head" / "ray_current_cluster"
    address_file.unlink(missing_ok=True)  # a previous cluster's address
    launch("head", head_flags)
    address = _wait_for(lambda: address_file.exists() and address_file.read_text().strip(),
                        START_TIMEOUT, "the head node", procs)
    state["address"] = address
    save_state(d, state)
    for name in NODES[1:]:
        launch(name, ["--address", address])
    _wait_for_registration(state, procs)


def start(args: argparse.Namespace) -> int:
    d = Path(args.dir).resolve()
    existing = load_state(d)
    if existing is not None and any(alive(p["pid"]) for p in existing["nodes"].values()):
        print(f"a cluster is already running from {d} (address {existing['address']}); "
              f"stop it first", file=sys.stderr)
        return 1
    state = _new_state(d, auth=not args.no_auth)
    try:
        _launch_nodes(args, d, state)
    except (RuntimeError, TimeoutError) as e:
        print(f"local cluster failed to start: {e}; logs in {d / 'logs'}", file=sys.stderr)
        stop(argparse.Namespace(dir=str(d), grace=5.0))
        return 1

    state["pids_at_start"] = cluster_pids(state)
    save_state(d, state)
    print_connection(state)
    return 0


def print_connection(state: dict[str, Any]) -> None:
    exports = " ".join(f"{k}={v}" for k, v in client_env(state).items())
    print(f"Ray cluster (3 nodes: head, a, b) at {state['address']}")
    print(f"  state dir:  {state['dir']}   (logs in {state['dir']}/logs)")
    if state["auth"]:
        print(f"  token auth: on; token in {state['token_file']} (0600)")
    else:
        print("  token auth: OFF (--no-auth)")
    print(f"  dashboard:  {state['dashboard'] or 'disabled'}")
    print("connect with:")
    print(f"  {exports} rollout-ray eval examples/arith.py --address {state['address']}")
    print(f"  or: eval \"$(python {Path(__file__).as_posix()} env --dir {state['dir']})\"")


def status(args: argparse.Namespace) -> int:
    d = Path(args.dir).resolve()
    state = load_state(d)
    if state is None:
        print(f"no cluster state in {d}")
        return 1
    up = {name: alive(n["pid"]) for name, n in state["nodes"].items()}
    print(f"cluster {state['id'][:8]} at {state['address']} (state dir {d})")
    for name, n in state["nodes"].items():
        print(f"  node {name:<4} ray start pid {n['pid']:<8} {'running' if up[name] else 'stopped'}")
    pids = cluster_pids(state)
    print(f"  processes of this cluster: {len(pids)}")
    if not any(up.values()):
        return 3
    os.environ.update(client_env(state))
    os.environ.pop("RAY_AUTH_TOKEN", None)
    try:
        nodes = _gcs_nodes(state["address"])
    except Exception as e:  # noqa: BLE001 - report, don't crash
        print(f"  GCS not answering: {type(e).__name__}: {e}")
        return 2
    for n in nodes:
        tags = sorted(k for k in n["resources"] if k.startswith("node_"))
        print(f"  alive: {n['ip']} {tags} CPU={n['resources'].get('CPU', 0):g}")
    return 0 if len(nodes) == len(state["nodes"]) else 2


def stop(args: argparse.Namespace) -> int:
    """SIGTERM the three supervisors; after ``grace`` SIGKILL whatever of the cluster is left."""
    d = Path(args.dir).resolve()
    state = load_state(d)
    if state is None:
        print(f"no cluster state in {d}; nothing to stop")
        return 0
    # Workers first, the head (GCS) last, so the workers do not fight a vanished GCS.
    for name in reversed(list(state["nodes"])):
        _signal([state["nodes"][name]["pid"]], signal.SIGTERM)
    deadline = time.monotonic() + args.grace
    while time.monotonic() < deadline and cluster_pids(state):
        time.sleep(0.2)
    left = cluster_pids(state)
    if left:
        print(f"killing {len(left)} leftover process(es) of the cluster: {left}")
        _signal(left, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and cluster_pids(state):
            time.sleep(0.1)
    remaining = cluster_pids(state)
    if remaining:
        print(f"still running: {remaining}", file=sys.stderr)
        return 1
    print(f"stopped cluster {state['id'][:8]} ({state['address']})")
    return 0


def env_cmd(args: argparse.Namespace) -> int:
    state = load_state(Path(args.dir).resolve())
    if state is None:
        print(f"no cluster state in {args.dir}", file=sys.stderr)
        return 1
    for k, v in client_env(state).items():
        print(f"export {k}={v}")
    print("unset RAY_AUTH_TOKEN")
    print(f"export ROLLOUT_RAY_ADDRESS={state['address']}")
    return 0


def address_cmd(args: argparse.Namespace) -> int:
    state = load_state(Path(args.dir).resolve())
    if state is None or not state.get("address"):
        print(f"no cluster state in {args.dir}", file=sys.stderr)
        return 1
    print(state["address"])
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("start", "stop", "status", "env", "address"):
        s = sub.add_parser(name)
        s.add_argument("--dir", default=str(default_dir()), help="state directory (default: %(default)s)")
        if name == "start":
            s.add_argument("--cpus", type=int, default=1, help="logical CPUs per node (default 1)")
            s.add_argument("--object-store-mb", type=int, default=200, help="object store per node (MiB)")
            s.add_argument("--dashboard", action="store_true", help="start the dashboard on 127.0.0.1")
            s.add_argument("--no-auth", action="store_true", help="disable Ray token authentication")
        if name == "stop":
            s.add_argument("--grace", type=float, default=20.0, help="seconds before SIGKILL")
    args = p.parse_args(argv)
    return {"start": start, "stop": stop, "status": status, "env": env_cmd, "address": address_cmd}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
