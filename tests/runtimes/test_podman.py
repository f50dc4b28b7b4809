"""Issue 32 §2: the ``podman`` provider holds the sandbox's probes — the grader's files out of
the agent's reach (and the agent's files out of the grader's module path), a timed-out exec
leaving nothing, no other rollout's secret in sight, an image by name or by archive, and a
SIGKILLed host leaving no container — against real Podman containers. Skipped, with the
reason, where Podman cannot run a container."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from image_rig import busybox_rootfs, docker_archive, image_unavailable, python_image, tar_bytes
from test_grader_files import FILES, PLANT, PROBE, Graded, agent

from rollout_ray import RolloutSpec, Trace
from rollout_ray._errors import SandboxError
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._runtimes.host import RuntimeHost
from rollout_ray._runtimes.podman import LABEL, PodmanRuntime, podman_unavailable
from rollout_ray.testing import ScriptedModel

pytestmark = pytest.mark.security


@functools.cache
def podman_reason() -> str | None:
    """Why Podman cannot run a container over the test image here, or ``None`` (tried once)."""
    reason = podman_unavailable() or image_unavailable()
    if reason is not None:
        return reason

    async def probe() -> str | None:
        rt = PodmanRuntime(root=str(Path(python_image()).parent), image=python_image())
        try:
            await rt.start()
            return None
        except SandboxError as e:
            return str(e)
        finally:
            await rt.stop()

    return asyncio.run(probe())


@pytest.fixture(autouse=True)
def _needs_podman() -> None:
    reason = podman_reason()
    if reason is not None:
        pytest.skip(f"podman cannot run a container here: {reason}")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@asynccontextmanager
async def box(tmp_path: Path, image: str | None = None, **env: str) -> AsyncIterator[PodmanRuntime]:
    rt = PodmanRuntime(root=str(tmp_path), image=image or python_image(), env=env)
    await rt.start()
    try:
        yield rt
    finally:
        await rt.stop()


LIVE = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done | grep -c '{}' || true"
"""Counts the container's processes whose command line matches (the pattern in brackets, so
the grep does not count itself)."""


def containers(token: str) -> list[str]:
    done = subprocess.run(
        ["podman", "ps", "-aq", "--filter", f"label={LABEL}={token}"], capture_output=True, text=True, timeout=60
    )
    return done.stdout.split()


def test_the_agent_finds_nothing_at_the_graders_path_and_can_put_nothing_there(tmp_path: Path) -> None:
    async def main() -> None:
        async with box(tmp_path) as rt:
            r = await rt.exec(["sh", "-c", PROBE])
            assert (r.exit_code, r.stdout) == (0, "probed\n"), r.stderr
            assert await rt.add_grader_files(FILES) == "/.grader"
            r = await rt.exec(["sh", "-c", "cat /.grader/expected; cat /.grader/tests/test_fix.py; ls -A /.grader"])
            assert r.stdout == FILES["expected"] + FILES["tests/test_fix.py"] + "expected\ntests\n"
            r = await rt.exec(
                [
                    "sh",
                    "-c",
                    "echo forged > /.grader/expected || rm -rf /.grader/tests; cat /.grader/expected; ls /.grader",
                ]
            )
            assert r.stdout == "42\nexpected\ntests\n"  # read-only for the grader's execs too

    run(main())


def test_an_agent_process_still_running_is_killed_before_the_files_arrive(tmp_path: Path) -> None:
    watcher = "while true; do cat /.grader/expected >> /tmp/stolen 2>/dev/null; echo > /tmp/started; sleep 0.01; done"

    async def main() -> None:
        async with box(tmp_path) as rt:
            watching = asyncio.ensure_future(rt.exec(["sh", "-c", watcher]))
            while not (await rt.exec(["sh", "-c", "test -e /tmp/started && echo yes"])).stdout:
                pass  # bounded by the test timeout: the watcher starts within milliseconds
            await rt.add_grader_files(FILES)
            result = await asyncio.wait_for(watching, 30)
            assert result.exit_code != 0
            assert (await rt.exec(["sh", "-c", "cat /tmp/stolen; echo end"])).stdout == "end\n"
            assert (await rt.exec(["sh", "-c", LIVE.format("[s]tolen")])).stdout == "0\n"

    run(main())


def test_a_grader_imports_nothing_the_agent_left(tmp_path: Path) -> None:
    async def main() -> None:
        async with box(tmp_path) as rt:
            planted = await rt.exec(["sh", "-c", PLANT])
            assert planted.stdout.endswith("planted\n"), planted.stderr
            assert await rt.add_grader_files(FILES) == "/.grader"
            graded = await rt.exec(["python3", "-m", "pytest", "--version"])
            assert "1 passed" not in graded.stdout, graded.stdout
            script = "pwd; echo $HOME; ls -A /tmp; python3 -c 'import sys; print(sys.path)'"
            lines = (await rt.exec(["sh", "-c", script])).stdout.splitlines()
            assert lines[:2] == ["/.grader", "/.grader"], lines
            assert "stolen" not in lines and "pth-ran" not in lines, lines
            path = ast.literal_eval(lines[-1])
            assert "" not in path and not any(".local" in p or p.startswith(rt.workdir) for p in path), path

    run(main())


def test_a_timed_out_exec_leaves_no_process_and_files_stay_in_the_container(tmp_path: Path) -> None:
    async def main() -> None:
        async with box(tmp_path) as rt:
            r = await rt.exec(["sh", "-c", "setsid sleep 1000 & sleep 1000"], timeout=1)
            assert r.timed_out and r.exit_code == -signal.SIGKILL
            assert (await rt.exec(["sh", "-c", LIVE.format("[s]leep 1000")])).stdout == "0\n"
            await rt.write("out/answer.txt", "42\n")
            assert (await rt.exec(["cat", "/work/out/answer.txt"])).stdout == "42\n"
            await rt.write("/top.txt", b"at the root")
            assert await rt.read("/top.txt") == b"at the root"
            await rt.exec(["sh", "-c", "ln -s /etc/hostname /work/link; echo inside > /etc/hostname"])
            assert await rt.read("link") == b"inside\n"  # the container's file, never the host's
            with pytest.raises(SandboxError, match="cannot start program 'no-such-program'"):
                await rt.exec(["no-such-program"])

    run(main())


def test_a_program_sees_no_host_variable_and_no_other_rollouts_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "host-secret")
    scan = (
        "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f 2>/dev/null; done "
        "| grep -c 'victim-secret\\|host-secret' || true"
    )

    async def main() -> None:
        async with box(tmp_path / "a") as victim, box(tmp_path / "b") as attacker:
            held = asyncio.ensure_future(victim.exec(["sleep", "60"], env={"OPENAI_API_KEY": "victim-secret"}))
            while "sleep" not in (await victim.exec(["ps"])).stdout:
                pass  # bounded by the test timeout
            assert (await victim.exec(["sh", "-c", scan])).stdout == "1\n"  # the scan finds what it looks for
            assert (await attacker.exec(["sh", "-c", scan])).stdout == "0\n"
            held.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await held

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    run(main())


def test_an_image_by_archive_by_name_and_a_missing_one(tmp_path: Path) -> None:
    archive = docker_archive(
        [tar_bytes(busybox_rootfs())],
        tmp_path / "busybox-docker.tar",
        {"WorkingDir": "/srv", "Env": ["FROM_IMAGE=yes"]},
    )

    async def main() -> None:
        async with box(tmp_path, image=str(archive)) as rt:
            r = await rt.exec(["sh", "-c", "pwd; echo $FROM_IMAGE; test -e /usr/bin/python3 || echo no-python"])
            assert r.stdout == "/srv\nyes\nno-python\n"
        async with box(tmp_path, image="localhost/rollout-ray/" + os.path.basename(archive)) as rt:
            pass  # never reached: the name is in no store
        pytest.fail("an image name podman does not hold started a container")

    with pytest.raises(SandboxError, match="is not in this node's podman store"):
        run(main())


def test_a_stop_during_the_start_leaves_no_container(tmp_path: Path) -> None:
    token = f"stop-during-start-{os.getpid()}"

    async def main() -> None:
        rt = PodmanRuntime(root=str(tmp_path), image=python_image(), host_token=token)
        starting = asyncio.ensure_future(rt.start())
        while not rt._created:  # the create is under way
            await asyncio.sleep(0)
        await rt.stop()
        with contextlib.suppress(SandboxError):  # unless the start had finished: then stopped after it
            await starting

    run(main())
    assert containers(token) == []


HOST_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    from rollout_ray._runtimes.host import RuntimeHost

    async def main():
        host = RuntimeHost(sys.argv[1], kind="podman")
        for name in ("a", "b"):
            await host.create_started(name, owner="x", image=sys.argv[2])
            await host.exec(name, ["sh", "-c", "setsid env -i sleep 1000 > /dev/null 2>&1 &"])
        print(json.dumps({"token": host.token, "guardian": host.guardian_pid()}), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


def test_a_killed_host_leaves_no_container(tmp_path: Path) -> None:
    root = tmp_path / "host"
    root.mkdir()
    host = subprocess.Popen(
        [sys.executable, "-c", HOST_SCRIPT, str(root), python_image()], stdout=subprocess.PIPE, text=True
    )
    token = ""
    try:
        facts = json.loads(host.stdout.readline())  # type: ignore[union-attr]
        token = facts["token"]
        assert len(containers(token)) == 2
        host.send_signal(signal.SIGKILL)  # by pid: the process we started
        host.wait()
        deadline = time.monotonic() + 60
        while (containers(token) or root.exists()) and time.monotonic() < deadline:
            pass  # each `podman ps` takes a while: a bounded poll
        assert containers(token) == []
        assert not root.exists()
    finally:
        host.kill()
        host.wait()
        host.stdout.close()  # type: ignore[union-attr]
        if token:  # only if the cleanup failed: ours to remove
            for found in containers(token):
                subprocess.run(["podman", "rm", "-f", "-t", "0", found], capture_output=True, timeout=60)


def test_the_host_makes_podman_runtimes_through_the_registry(tmp_path: Path) -> None:
    async def main() -> tuple[Any, str]:
        host = RuntimeHost(str(tmp_path), kind="podman")
        try:
            info = await host.create_started("r", owner="o", image=python_image())
            return info, (await host.exec("r", ["python3", "-c", "print(6 * 7)"])).stdout
        finally:
            await host.shutdown()

    info, out = run(main())
    assert (info.type, out) == ("podman", "42\n")


def test_a_rollout_over_podman_scores_with_files_its_agent_never_saw() -> None:
    """The whole lifecycle through the provider: the executor's host makes the rollout's box
    with ``--runtime podman``; the agent probes ``/.grader`` and answers; the task scores."""

    async def main() -> Trace:
        async with LocalExecutor(runtime="podman") as executor:
            task = Graded({"prompt": "fix it", "image": python_image()})
            return await executor.run(RolloutSpec(task, agent("42"), ScriptedModel(default="done")))

    trace = run(main())
    assert trace.errors == [], trace.errors
    assert trace.agent.runtime is not None and trace.agent.runtime.type == "podman"
    assert {k: r.score for k, r in trace.rewards.items()} == {"passed": 1.0, "hidden_from_agent": 1.0}


def test_a_large_file_is_read_only_up_to_max_bytes_and_a_directory_is_refused(tmp_path: Path) -> None:
    """Security review F2: ``read`` buffered the whole ``podman cp`` tar before trimming it (a
    300 MB file: +600 MiB on the host); now it streams and stops at ``max_bytes``."""
    import resource

    async def main() -> None:
        async with box(tmp_path) as rt:
            made = await rt.exec(["sh", "-c", "head -c 314572800 /dev/zero > /work/big && echo made"], timeout=120)
            assert made.stdout == "made\n", made.stderr
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            assert await rt.read("/work/big", max_bytes=16) == b"\0" * 16
            grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
            assert grown_mib < 100, f"reading 16 bytes grew this process's peak memory by {grown_mib} MiB"
            await rt.exec(["mkdir", "-p", "/work/dir/sub"])
            with pytest.raises(SandboxError, match="not a regular file"):
                await rt.read("/work/dir")
            with pytest.raises(SandboxError, match="read '/work/missing'"):
                await rt.read("/work/missing")

    run(main())


def test_an_execs_variables_are_not_on_the_podman_command_line() -> None:
    """Security review F5: ``--env NAME=value`` put an exec's secrets in ``ps`` for every user
    of the host; values now go through the podman client's environment."""
    from rollout_ray._runtimes.podman_cli import exec_command as _exec_command

    command, env = _exec_command(
        "c1", ["sh", "-c", "echo $OPENAI_API_KEY"], {"OPENAI_API_KEY": "sk-secret"}, "/work", interactive=False
    )
    assert not any("sk-secret" in a for a in command)
    assert command[:6] == ["podman", "exec", "--workdir", "/work", "--env", "OPENAI_API_KEY"]
    assert env["OPENAI_API_KEY"] == "sk-secret"


def test_an_execs_variable_passed_by_name_still_reaches_the_program_whole(tmp_path: Path) -> None:
    async def main() -> None:
        async with box(tmp_path) as rt:
            r = await rt.exec(["sh", "-c", 'echo "$OPENAI_API_KEY"'], env={"OPENAI_API_KEY": "sk-secret=with=equals"})
            assert r.stdout == "sk-secret=with=equals\n", r.stderr

    run(main())


FETCH = (
    "import sys, urllib.request\n"
    "try:\n"
    "    print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())\n"
    "except OSError as e:\n"
    "    print('unreachable', type(e).__name__)\n"
)


def test_a_host_service_is_unreachable_and_only_the_allowed_route_is_served(tmp_path: Path) -> None:
    """Security review F1: the container shared the host's network (``--network host``): its
    program reached every host loopback port, Ray's included. Now only the routes allowed."""
    import http.server
    import threading

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"host-only " + self.path.encode())

        def log_message(self, *args: Any) -> None:
            pass

    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    secret, allowed = (f"http://127.0.0.1:{s.server_address[1]}/x" for s in servers)

    async def main() -> None:
        async with box(tmp_path) as rt:
            fetch = ["python3", "-c", FETCH]
            assert (await rt.exec([*fetch, secret], timeout=30)).stdout.startswith("unreachable")
            await rt.prepare_execution([allowed.removesuffix("/x")])
            assert (await rt.exec([*fetch, allowed], timeout=30)).stdout == "host-only /x\n"
            assert (await rt.exec([*fetch, secret], timeout=30)).stdout.startswith("unreachable")
            await rt.prepare_execution(None)
            assert (await rt.exec([*fetch, allowed], timeout=30)).stdout.startswith("unreachable")

    try:
        run(main())
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_an_agent_program_in_the_container_reaches_the_proxy_through_its_route() -> None:
    """With ``--network none``, the example agent still reaches the rollout's proxy: through the
    route ``prepare_execution`` allows, not through the host's network."""
    from test_image_sandbox import AGENT_SOURCE, Three

    from rollout_ray._harnesses.program import ProgramHarness

    async def main() -> Trace:
        async with LocalExecutor(runtime="podman") as executor:
            harness = ProgramHarness(
                ["python3", "agent_program.py"], files={"agent_program.py": AGENT_SOURCE}, timeout=60
            )
            task = Three({"prompt": "1+2?", "image": python_image()})
            return await executor.run(RolloutSpec(task, harness, ScriptedModel(["3"])))

    trace = run(main())
    assert trace.errors == [], trace.errors
    assert trace.agent.runtime is not None and trace.agent.runtime.type == "podman"
    assert trace.rewards["correct"].score == 1.0 and trace.num_turns == 1


LOOK_SERVER = """
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    if m["method"] == "initialize":
        r = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "l", "version": "1"}}
    elif m["method"] == "tools/list":
        r = {"tools": [{"name": "look", "inputSchema": {"type": "object"}}]}
    else:
        path = m["params"]["arguments"]["path"]
        seen = {"files": sorted(os.listdir(".")), "host_file": os.path.exists(path), "env": sorted(os.environ)}
        r = {"content": [{"type": "text", "text": json.dumps(seen)}]}
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r}), flush=True)
"""


def test_a_stdio_mcp_server_of_a_podman_rollout_runs_in_its_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30 §1: the server is the container's program (``podman exec -i``): it sees the
    container's files, not the host's, and no host variable; the runtime's stop ends it."""
    from rollout_ray._core.tools import LocalTools, close_toolsets, open_toolsets
    from rollout_ray._record.messages import ToolCall
    from rollout_ray._serving.mcp_pool import close_clients
    from rollout_ray._serving.mcp_toolset import MCPToolset

    monkeypatch.setenv("HOST_SECRET", "sk-host-do-not-leak")
    host_file = tmp_path / "host-only.txt"
    host_file.write_text("the host's")

    async def main() -> None:
        async with box(tmp_path) as rt:
            await rt.write("inside.txt", "the container's")
            tools = MCPToolset("look", command=["python3", "-c", LOOK_SERVER], env={"GIVEN": "1"}, timeout=60)
            await open_toolsets([tools], rt)
            try:
                result = await LocalTools([tools], None).call(ToolCall("1", "look", {"path": str(host_file)}))
                seen = json.loads(result.content)
                running = (await rt.exec(["sh", "-c", LIVE.format("[t]ools/list")])).stdout
            finally:
                await close_toolsets([tools])
                await close_clients()
            assert seen["host_file"] is False and "inside.txt" in seen["files"]
            assert "GIVEN" in seen["env"] and "HOST_SECRET" not in seen["env"]
            assert running == "1\n"  # the server is a process of the container
            assert (await rt.exec(["sh", "-c", LIVE.format("[t]ools/list")])).stdout == "0\n"  # closed: gone

    run(main())
