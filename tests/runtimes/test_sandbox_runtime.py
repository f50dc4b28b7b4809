"""SandboxRuntime: filesystem, PID and network isolation, limits, teardown, a full rollout."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import calc_taskset
import pytest
from calc_taskset import Arith
from image_rig import BOXES, host_path

from rollout_ray import (
    Reward,
    Rollout,
    RolloutSpec,
    SandboxRuntime,
    Task,
    ToolServer,
    Trace,
    reward,
)
from rollout_ray._errors import SandboxError
from rollout_ray._harnesses.program import ProgramHarness
from rollout_ray._runtimes.guardian import pids_with_marker
from rollout_ray._runtimes.local import RUNTIME_MARKER
from rollout_ray._runtimes.sandbox import sandbox_unavailable
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray.testing import Reply, ScriptedModel

from conftest import process_alive, wait_exit

REASON = sandbox_unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no sandbox on this machine: {REASON}")

AGENT_SOURCE = (Path(__file__).resolve().parents[2] / "examples" / "agent_program.py").read_text()


def agent(**kwargs: Any) -> ProgramHarness:
    """The example agent, shipped into the runtime: a sandbox sees nothing of the checkout."""
    return ProgramHarness(["python3", "agent_program.py"], files={"agent_program.py": AGENT_SOURCE}, **kwargs)


@pytest.fixture(params=BOXES)
def box(request: pytest.FixtureRequest) -> Callable[..., SandboxRuntime]:
    """The isolation tests hold over the host's system and over an image alike."""
    return request.param


@asynccontextmanager
async def sandbox(
    tmp_path: Path, box: Callable[..., SandboxRuntime] = SandboxRuntime, **kwargs: Any
) -> AsyncIterator[SandboxRuntime]:
    rt = box(root=str(tmp_path), **kwargs)
    await rt.start()
    try:
        yield rt
    finally:
        await rt.stop()


def run(main: Callable[[], Any]) -> Any:
    return asyncio.run(main())


def py(code: str, *args: str) -> list[str]:
    return ["python3", "-c", code, *args]


def mounts_under(root: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [p for p in (line.split()[4] for line in f) if p == root or p.startswith(root.rstrip("/") + "/")]


def assert_all_killed(rt: SandboxRuntime) -> None:
    """Nothing of the runtime is left: the last SIGKILLed processes may still be exiting."""
    assert pids_with_marker(RUNTIME_MARKER, rt._token) == []
    assert rt._cgroups is not None
    for pid in rt._cgroups.pids():
        wait_exit(pid, 5.0)


def test_declares_what_it_enforces_and_validates_limits(tmp_path: Path) -> None:
    assert "network" in SandboxRuntime.enforces
    assert SandboxRuntime.enforces == {"filesystem", "pid", "network", "pids", "memory", "disk", "uid", "output"}
    assert SandboxRuntime(pids_limit=None).enforces == SandboxRuntime.enforces - {"pids"}
    assert SandboxRuntime(disk_limit=None).enforces == SandboxRuntime.enforces - {"disk"}
    with pytest.raises(ValueError, match=r"^`memory_limit` must be >= 1 or None, got 0$"):
        SandboxRuntime(memory_limit=0)


def test_work_dir_is_writable_and_the_system_read_only(tmp_path: Path) -> None:
    outside = tmp_path / "host-file"
    outside.write_text("host")

    async def main() -> None:
        async with sandbox(tmp_path) as rt:
            assert rt.info().type == "sandbox"
            await rt.write("in/put.txt", "from host")
            await rt.write("/tmp/shared", "tmp from host")
            script = (
                "pwd; cat in/put.txt; echo; cat /tmp/shared; echo; echo made > out.txt; "
                "for p in /usr/x /etc/x /x; do touch $p 2>/dev/null && echo wrote $p; done; "
                f"test -e {outside} && echo sees host tmp; echo $HOME"
            )
            r = await rt.exec(["sh", "-c", script])
            assert (r.exit_code, r.stderr) == (0, "")
            assert r.stdout == f"{rt.id}\nfrom host\ntmp from host\n{rt.id}\n"
            assert await rt.read("out.txt") == b"made\n"
            r = await rt.exec(["sh", "-c", "echo kept > /tmp/later"])
            assert await rt.read("/tmp/later") == b"kept\n"  # /tmp lives as long as the runtime
            with pytest.raises(ValueError, match="outside the work directory and /tmp"):
                await rt.write("/etc/x", "no")
            with pytest.raises(ValueError, match="outside the work directory and /tmp"):
                await rt.read("../" * 20 + "etc/hostname")
            with pytest.raises(FileNotFoundError):
                await rt.read(str(outside))  # the sandbox's /tmp is its own

    run(main)


def test_programs_have_their_own_pid_namespace(tmp_path: Path, box: Callable[..., SandboxRuntime]) -> None:
    async def main() -> None:
        async with sandbox(tmp_path, box) as rt:
            script = f"echo $$; ls /proc | grep -c '^[0-9]'; kill -0 {os.getpid()} 2>/dev/null || echo hidden"
            r = await rt.exec(["sh", "-c", script])
            pid, count, hidden = r.stdout.split()
            assert int(pid) <= 3 and int(count) <= 5 and hidden == "hidden"

    run(main)


NETWORK_PROBE = """
import json, socket, sys, urllib.request
def probe(host, port):
    try:
        socket.create_connection((host, port), timeout=5).close()
        return "connected"
    except OSError as e:
        return type(e).__name__
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    route = opener.open(sys.argv[1], timeout=5).read().decode()
except OSError as e:
    route = type(e).__name__
print(json.dumps({"route": route, "other": probe("127.0.0.1", int(sys.argv[2])),
                  "ray": probe("127.0.0.1", int(sys.argv[3])),
                  "outside": probe("10.255.255.1", 80), "dns": probe("1.1.1.1", 53)}))
"""


@asynccontextmanager
async def http_server(body: bytes) -> AsyncIterator[int]:
    """A one-answer HTTP server on 127.0.0.1; yields its port."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


def test_network_is_only_the_framework_routes(tmp_path: Path, box: Callable[..., SandboxRuntime]) -> None:
    async def main() -> None:
        async with (
            sandbox(tmp_path, box) as rt,
            http_server(b"route ok") as route,
            http_server(b"other") as other,
            http_server(b"ray") as ray_like,
        ):
            url = f"http://127.0.0.1:{route}/v1/models"
            assert rt.host_url(url) == url
            await rt.prepare_execution([url, f"http://127.0.0.1:{route}/tool/x"])
            r = await rt.exec(py(NETWORK_PROBE, url, str(other), str(ray_like)), timeout=30)
            assert r.exit_code == 0, r.stderr
            assert json.loads(r.stdout) == {
                "route": "route ok",
                "other": "ConnectionRefusedError",
                "ray": "ConnectionRefusedError",
                "outside": "OSError",
                "dns": "OSError",
            }
            await rt.prepare_execution(None)  # no routes: nothing at all
            r = await rt.exec(py(NETWORK_PROBE, url, str(other), str(ray_like)), timeout=30)
            assert json.loads(r.stdout)["route"] == "URLError"

    run(main)


def test_remote_routes_are_served_on_loopback_and_bad_routes_refused(
    tmp_path: Path, box: Callable[..., SandboxRuntime]
) -> None:
    async def main() -> None:
        async with sandbox(tmp_path, box) as rt:
            url = rt.host_url("http://10.1.2.3:8080/v1")
            assert url == "http://127.0.0.1:8080/v1"
            await rt.prepare_execution([url])
            routes = [(p, r.host, r.port) for p, r in rt._routes.routes.items()]
            assert routes == [(8080, "10.1.2.3", 8080)]
            with pytest.raises(ValueError, match=r"^route 'ftp://127.0.0.1:2121/' must be an http"):
                await rt.prepare_execution(["ftp://127.0.0.1:2121/"])
        with pytest.raises(SandboxError, match="is stopped"):
            await rt.prepare_execution([url])

    run(main)


FORK_BOMB = """
import os, signal
count = 0
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        signal.pause()
    count += 1
print(count)
"""

ENDLESS_FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""


def test_fork_bomb_is_bounded_and_killed(tmp_path: Path, box: Callable[..., SandboxRuntime]) -> None:
    async def main() -> None:
        async with sandbox(tmp_path, box, pids_limit=32) as rt:
            r = await rt.exec(py(FORK_BOMB), timeout=30)
            assert r.exit_code == 0 and 0 < int(r.stdout) < 32
            r = await rt.exec(py(ENDLESS_FORK_BOMB), timeout=0.5)
            assert r.timed_out and r.exit_code == -9
            assert_all_killed(rt)
            assert (await rt.exec(["true"])).exit_code == 0  # the runtime still works

    run(main)


def test_memory_hog_is_killed(tmp_path: Path, box: Callable[..., SandboxRuntime]) -> None:
    async def main() -> None:
        async with sandbox(tmp_path, box, memory_limit=64 << 20) as rt:
            r = await rt.exec(py("b = bytearray(512 << 20); print('survived')"), timeout=30)
            assert r.exit_code == 128 + 9 and r.stdout == ""

    run(main)


def test_output_flood_is_truncated(tmp_path: Path, box: Callable[..., SandboxRuntime]) -> None:
    async def main() -> None:
        async with sandbox(tmp_path, box) as rt:
            r = await rt.exec(["sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' x"], max_output=1000, timeout=30)
            assert r.exit_code == 0 and r.stdout == "x" * 1000 and r.stdout_truncated

    run(main)


def test_timeout_kills_the_whole_tree(tmp_path: Path, box: Callable[..., SandboxRuntime]) -> None:
    async def main() -> None:
        async with sandbox(tmp_path, box) as rt:
            script = "env -i sleep 30 & setsid sleep 30 & echo started >&2; wait"
            r = await rt.exec(["sh", "-c", script], timeout=0.5)
            assert r.timed_out and r.exit_code == -9 and r.stderr == "started\n"
            assert_all_killed(rt)

    run(main)


def test_stop_kills_everything_and_removes_its_dirs(tmp_path: Path, box: Callable[..., SandboxRuntime]) -> None:
    async def main() -> None:
        rt = box(root=str(tmp_path))
        await rt.start()
        assert rt._cgroups is not None and rt._base is not None
        cgroups, base = list(rt._cgroups.dirs), rt._base
        os.mkfifo(host_path(rt, "ready"))
        running = asyncio.ensure_future(rt.exec(["sh", "-c", "env -i sleep 1000 & echo go > ready; wait"], timeout=30))
        async with asyncio.timeout(10):
            await asyncio.to_thread(Path(host_path(rt, "ready")).read_text)  # returns once it wrote
        pids = rt._cgroups.pids()
        assert len(pids) >= 4  # bwrap, its init, sh, sleep
        await rt.stop()
        with pytest.raises(SandboxError, match="runtime .* stopped"):
            await running
        assert [p for p in pids if process_alive(p)] == []
        assert not os.path.exists(base) and not any(os.path.exists(d) for d in cgroups)
        assert os.listdir(tmp_path) == [] and mounts_under(str(tmp_path)) == []

    run(main)


def test_program_rollout_reaches_proxy_and_tools_from_the_sandbox(
    tmp_path: Path, box: Callable[..., SandboxRuntime]
) -> None:
    model = ScriptedModel([Reply(tool_calls=[("add", {"a": 1, "b": 2})]), "3"])

    async def main() -> Trace:
        async with HTTPInterception() as proxy, ToolServer() as tools:
            return await Rollout(
                Arith({"prompt": "1+2?"}),
                agent(timeout=60),
                model=model,
                interception=proxy,
                tool_server=tools.serve,
                runtime_factory=lambda name: box(name, root=str(tmp_path)),
            ).run()

    trace = run(main)
    assert trace.errors == []
    assert (trace.ok, trace.stop_condition, trace.num_turns) == (True, "agent_completed", 2)
    assert trace.agent.runtime is not None and trace.agent.runtime.type == "sandbox"
    assert trace.rewards == {"correct": Reward(1.0)}
    assert os.listdir(tmp_path) == []


class Three(Task):
    @reward
    def correct(self, trace: Trace) -> float:
        return float(trace.last_reply == "3")


AIOHTTP_AGENT = """
import asyncio, json, os
import aiohttp, msgspec  # in the environment running rollout-ray, not in the base Python

async def main():
    with open(os.environ["ROLLOUT_RAY_INPUT"]) as f:
        messages = json.load(f)["messages"]
    headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
    async with aiohttp.ClientSession() as http:
        async with http.post(os.environ["OPENAI_BASE_URL"] + "/chat/completions", headers=headers,
                             data=msgspec.json.encode({"messages": messages})) as resp:
            print(msgspec.json.decode(await resp.read())["choices"][0]["message"]["content"])

asyncio.run(main())
"""


@pytest.mark.parametrize("python", ["python3", sys.executable], ids=["python3", "sys.executable"])
def test_an_agent_imports_the_packages_of_the_environment_running_rollout_ray(tmp_path: Path, python: str) -> None:
    """A ``ProgramHarness`` agent importing packages installed only in the virtual environment
    (aiohttp, msgspec) runs in the sandbox: the environment's site-packages are there,
    read-only, at their host path."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("not running in a virtual environment")
    base = subprocess.run(
        [os.path.realpath(sys.executable), "-I", "-c", "import aiohttp, msgspec"], capture_output=True, timeout=60
    )
    assert base.returncode != 0  # the base installation does not have them: only the venv does
    harness = ProgramHarness([python, "agent.py"], files={"agent.py": AIOHTTP_AGENT}, timeout=60)

    async def main() -> Trace:
        async with HTTPInterception() as proxy:
            return await Rollout(
                Three({"prompt": "1+2?"}),
                harness,
                model=ScriptedModel(["3"]),
                interception=proxy,
                runtime_factory=lambda name: SandboxRuntime(name, root=str(tmp_path)),
            ).run()

    trace = run(main)
    assert trace.errors == []
    assert (trace.ok, trace.rewards) == (True, {"correct": Reward(1.0)})

    async def site_packages() -> str:
        async with sandbox(tmp_path) as rt:
            r = await rt.exec([python, "-c", "import msgspec; print(msgspec.__file__)"], timeout=30)
            assert r.exit_code == 0, r.stderr
            probe = await rt.exec(["sh", "-c", f"touch {os.path.dirname(r.stdout.strip())}/x || echo read-only"])
            assert probe.stdout.strip() == "read-only"
            return r.stdout.strip()

    assert run(site_packages) == sys.modules["msgspec"].__file__


def test_any_root_works_var_tmp_included(tmp_path: Path) -> None:
    """/var/tmp is a link to /tmp inside: a runtime whose directory is under the host's
    /var/tmp still starts its programs; under /etc or /proc (the sandbox's own) it is refused."""
    var_tmp = tempfile.mkdtemp(prefix="rr-test-", dir="/var/tmp")
    try:
        for root in (var_tmp, str(tmp_path)):

            async def main(root: str = root) -> None:
                async with sandbox(Path(root)) as rt:
                    r = await rt.exec(["sh", "-c", "pwd; echo kept > /var/tmp/x; cat /tmp/x"])
                    assert (r.exit_code, r.stderr, r.stdout) == (0, "", f"{rt.id}\nkept\n")

            run(main)
            assert os.listdir(root) == []
    finally:
        os.rmdir(var_tmp)
    for root in ("/etc/rollout-ray", "/proc/self"):
        with pytest.raises(ValueError, match=rf"^`root` '{root}' is under /(etc|proc), which a sandbox replaces"):
            SandboxRuntime(root=root)


@pytest.mark.ray
def test_the_session_rays_own_ports_are_unreachable_from_the_sandbox(
    ray_cluster: Any, tmp_path: Path, box: Callable[..., SandboxRuntime]
) -> None:
    """The real thing, not a look-alike: the GCS and a raylet's ports of the test session's Ray."""
    gcs_port = int(ray_cluster.get_runtime_context().gcs_address.rsplit(":", 1)[1])
    (node,) = [n for n in ray_cluster.nodes() if n["Alive"]]
    ports = [gcs_port, int(node["NodeManagerPort"]), int(node["ObjectManagerPort"])]
    probe = (
        "import socket, sys\nfor port in sys.argv[1:]:\n"
        "    try:\n        socket.create_connection(('127.0.0.1', int(port)), timeout=5).close(); print('connected')\n"
        "    except OSError as e:\n        print(type(e).__name__)\n"
    )

    async def main() -> None:
        async with sandbox(tmp_path, box) as rt:
            r = await rt.exec(py(probe, *map(str, ports)), timeout=30)
            assert r.exit_code == 0, r.stderr
            assert r.stdout.split() == ["ConnectionRefusedError"] * len(ports)

    for port in ports:  # they do listen on the host, so the refusal is the sandbox's doing
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    run(main)


@pytest.mark.ray
def test_a_ray_rollout_actor_runs_its_rollouts_in_sandboxes(ray_cluster: Any) -> None:
    """``RolloutActor.create(runtime="sandbox")``: the runtime actor hosts SandboxRuntimes, and
    the program reaches the node's proxy and tool server through the sandbox's relays."""
    from rollout_ray._ray.rollout_client import RolloutActor

    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray_cluster.cloudpickle.register_pickle_by_value(calc_taskset)
    model = ScriptedModel([Reply(tool_calls=[("add", {"a": 1, "b": 2})]), "3"])

    async def main() -> Trace:
        actor = RolloutActor.create(capacity=1, runtime="sandbox")
        try:
            return await actor.run(RolloutSpec(Arith({"prompt": "1+2?"}), agent(timeout=60), model))
        finally:
            await actor.aclose()

    trace = asyncio.run(main())
    assert trace.errors == []
    assert (trace.ok, trace.num_turns, trace.rewards) == (True, 2, {"correct": Reward(1.0)})
    assert trace.agent.runtime is not None and trace.agent.runtime.type == "sandbox"
    with pytest.raises(ValueError, match="runtime must be one of"):
        RolloutActor.create(runtime="docker")
