"""Issue 10 §2–§3: what a program in a runtime must not reach or survive.

The host's files, secrets and sockets (sandbox), the host's environment (both kinds), links
and FIFOs a program plants for the host side's ``read`` / ``write`` (both kinds), the disk
(sandbox), a dead host's cgroups and mounts, and processes that escape ``stop()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from image_rig import (
    BOXES,
    busybox_rootfs,
    host_path,
    image_sandbox,
    needs_image,
    ns_mountinfo,
    python_image,
    rootfs_tarball,
    shared_cache,
)

from rollout_ray import LocalRuntime, Rollout, SandboxRuntime, Task
from rollout_ray._errors import SandboxError
from rollout_ray._harnesses.program import ProgramHarness
from rollout_ray._runtimes.guardian import pids_with_marker
from rollout_ray._runtimes.local import RUNTIME_MARKER
from rollout_ray._runtimes.sandbox import sandbox_unavailable
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray.testing import ScriptedModel

from conftest import process_alive, wait_exit

pytestmark = pytest.mark.security

SCENARIOS = {
    "test_sandbox_hides_host_files_secrets_and_sockets": (
        "read /etc/shadow, /root, host /tmp files, unix sockets",
        "none of them exists inside",
        "0 read",
    ),
    "test_programs_run_as_an_unprivileged_user_with_python_on_path": (
        "id -u in the sandbox",
        "uid 1000, no capabilities",
        "0 root programs",
    ),
    "test_environment_is_an_allow_list": (
        "RAY_AUTH_TOKEN, AWS_SECRET_ACCESS_KEY, HF_TOKEN, GITHUB_TOKEN on the host",
        "allow-list only",
        "0 secrets passed",
    ),
    "test_read_and_write_never_follow_planted_links": (
        "answer.txt -> host file; link to a 0000 file",
        "refused: no link followed",
        "0 host files touched",
    ),
    "test_a_planted_fifo_fails_fast": ("a FIFO where a file is read", "refused at once", "0 hangs"),
    "test_disk_limit_fails_the_exec_and_spares_the_host": (
        "write past disk_limit",
        "SandboxError, disk limit reached",
        "0 bytes on the host",
    ),
    "test_filling_the_disk_fails_the_rollout_with_sandbox_error": (
        "a program fills its disk",
        "the rollout fails with SandboxError",
        "0 host disk",
    ),
    "test_a_killed_host_leaves_no_process_cgroup_mount_or_file": (
        "SIGKILL of a runtime host",
        "guardian cleaned up",
        "0 processes, cgroups, mounts, files",
    ),
    "test_local_stop_kills_a_process_that_left_its_session_and_cleared_its_environment": (
        "setsid + env -i escapee",
        "killed by stop() (cgroup)",
        "0 survivors",
    ),
    "test_the_default_runtime_keeps_rollouts_out_of_each_others_processes": (
        "scan /proc/*/environ for another rollout's secret",
        "default runtime: sandbox",
        "0 secrets read",
    ),
    "test_image_sandboxes_keep_rollouts_out_of_each_others_processes": (
        "scan /proc/*/environ for another rollout's secret",
        "image sandboxes",
        "0 secrets read",
    ),
    "test_local_spawn_then_stop_never_leaves_a_process": (
        "300 spawn-then-stop cycles",
        "every program killed",
        "0 survivors",
    ),
}


@pytest.fixture(autouse=True)
def _scenario_row(request: pytest.FixtureRequest, report: Any) -> Iterator[None]:
    """A row of the suites' table for each scenario that passed."""
    started = time.monotonic()
    yield
    row = SCENARIOS.get(request.node.originalname)
    rep = getattr(request.node, "rep_call", None)
    if row is not None and rep is not None and rep.passed:
        label = request.node.originalname.removeprefix("test_").replace("_", " ")
        kind = f" [{request.node.callspec.id}]" if hasattr(request.node, "callspec") else ""
        report(f"10§2-3 {label[:40]}{kind}", *row, time.monotonic() - started)


REASON = sandbox_unavailable()
needs_sandbox = pytest.mark.skipif(REASON is not None, reason=f"no sandbox on this machine: {REASON}")
KINDS = [
    pytest.param(LocalRuntime, id="local"),
    pytest.param(SandboxRuntime, id="sandbox", marks=needs_sandbox),
    pytest.param(image_sandbox, id="image", marks=needs_image),
]
CHECKOUT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


@asynccontextmanager
async def running(rt: LocalRuntime) -> AsyncIterator[Any]:
    await rt.start()
    try:
        yield rt
    finally:
        await rt.stop()


def run(main: Callable[[], Any]) -> Any:
    return asyncio.run(main())


def mounts_under(root: str, rt: Any = None) -> list[str]:
    """Mount points at or under ``root`` (read here, not with the guardian's helper), in this
    process's mount namespace or, given a sandbox ``rt`` with one, in the sandbox's own."""
    ns = getattr(rt, "_ns", None)
    if ns is not None:
        table = ns_mountinfo(ns)
    else:
        with open("/proc/self/mountinfo") as f:
            table = f.read()
    points = [line.split()[4] for line in table.splitlines()]
    return [p for p in points if p == root or p.startswith(root.rstrip("/") + "/")]


# -- §2 the host's files, secrets and sockets ---------------------------------------------------


PROBE = """
import json, os, socket, sys
files, sockets = json.loads(sys.argv[1]), json.loads(sys.argv[2])
def read(path):
    try:
        with open(path, "rb") as f:
            f.read(1)
        return "readable"
    except OSError as e:
        return type(e).__name__
def connect(path):
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        s.close()
        return "connected"
    except OSError as e:
        return type(e).__name__
print(json.dumps({"uid": os.getuid(), "euid": os.geteuid(), "root": sorted(os.listdir("/root"))
                  if os.path.isdir("/root") else None,
                  "files": {p: read(p) for p in files}, "sockets": {p: connect(p) for p in sockets}}))
"""


VENV = sys.prefix if sys.prefix != sys.base_prefix else None
"""The virtual environment running the tests: a sandbox sees its site-packages, nothing else."""


@contextlib.contextmanager
def host_secrets() -> Iterator[tuple[list[str], list[str]]]:
    """Secret files (0600) and listening unix sockets in the host's /tmp, /var/tmp, /run and
    /root, and in the virtual environment's root, ``bin`` and ``lib`` (where writable);
    removed afterwards."""
    tag = uuid.uuid4().hex[:8]
    venv_dirs = [os.path.join(VENV, d) for d in ("", "bin", "lib")] if VENV else []
    dirs = [d for d in ("/tmp", "/var/tmp", "/run", "/root", *venv_dirs) if os.access(d, os.W_OK)]
    files, sockets, listeners = [], [], []
    try:
        for d in dirs:
            path = os.path.join(d, f".rr-secret-{tag}")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, b"host secret")
            os.close(fd)
            files.append(path)
            if len(os.path.join(d, f".rr-sock-{tag}")) > 100:  # beyond a unix socket's path
                continue
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(os.path.join(d, f".rr-sock-{tag}"))
            listener.listen()
            listeners.append(listener)
            sockets.append(listener.getsockname())
        yield files, sockets
    finally:
        for listener in listeners:
            listener.close()
        for path in files + sockets:
            with contextlib.suppress(OSError):
                os.unlink(path)


@pytest.mark.parametrize("box", BOXES)
@needs_sandbox
def test_sandbox_hides_host_files_secrets_and_sockets(box: Callable[..., SandboxRuntime], tmp_path: Path) -> None:
    assert os.path.exists("/etc/shadow")  # the host has them: their absence is the sandbox's
    system = [
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/sudoers",
        "/etc/machine-id",
        "/etc/ssl/private",
        "/root/.ray",
        "/root/.ssh",
        "/root/.bashrc",
        "/home",
        str(CHECKOUT / "README.md"),
        str(tmp_path / "host-file"),
    ]
    if VENV:  # its scripts and pip's configuration are not what a program needs to import
        system += [os.path.join(VENV, "bin", "activate"), os.path.join(VENV, "bin", "pip")]

    async def main(files: list[str], sockets: list[str]) -> dict[str, Any]:
        async with running(box(root=str(tmp_path / "rt"))) as rt:
            r = await rt.exec(["python3", "-c", PROBE, json.dumps(files + system), json.dumps(sockets)], timeout=30)
            assert r.exit_code == 0, r.stderr
            return json.loads(r.stdout)

    (tmp_path / "rt").mkdir()
    (tmp_path / "host-file").write_text("next to the runtime's directory")
    with host_secrets() as (files, sockets):
        assert len(files) >= 2 and len(sockets) >= 2  # /tmp and /var/tmp at least
        seen = asyncio.run(main(files, sockets))
    assert seen["uid"] != 0 and seen["euid"] != 0
    assert {p: r for p, r in seen["files"].items() if r not in ("FileNotFoundError",)} == {}
    assert {p: r for p, r in seen["sockets"].items() if r != "FileNotFoundError"} == {}
    # /root holds at most the paths to the interpreter's base installation (pyenv here) and to
    # the virtual environment; an image's /root is the image's.
    shown = {p.split("/")[2] for p in (os.path.realpath(sys.base_prefix), VENV or "") if p.startswith("/root/")}
    assert seen["root"] in (None, [] if box is image_sandbox else sorted(shown))


@pytest.mark.parametrize("box", BOXES)
@needs_sandbox
def test_programs_run_as_an_unprivileged_user_with_python_on_path(
    box: Callable[..., SandboxRuntime], tmp_path: Path
) -> None:
    async def main() -> None:
        async with running(box(root=str(tmp_path))) as rt:
            r = await rt.exec(
                ["sh", "-c", "id -u; id -un; echo $HOME; python3 -c 'print(7)'; grep CapEff /proc/self/status"],
                timeout=30,
            )
            assert r.exit_code == 0, r.stderr
            uid, user, home, seven, _, caps = r.stdout.split()
            assert (int(uid) != 0, user, home, seven, int(caps, 16)) == (True, "sandbox", rt.workdir, "7", 0)
            if box is image_sandbox:
                return  # the image's Python: the host's interpreter path means nothing there
            # The host interpreter's path still runs (the base interpreter, with the venv's packages).
            r = await rt.exec([sys.executable, "-c", "import sys; print(sys.version_info[:2])"], timeout=30)
            assert (r.exit_code, r.stdout.strip()) == (0, str(sys.version_info[:2])), r.stderr

    run(main)


# -- §2 the environment: an allow-list, in both kinds -----------------------------------------


SECRETS = {
    "RAY_AUTH_TOKEN": "ray-token",
    "AWS_SECRET_ACCESS_KEY": "aws",
    "HF_TOKEN": "hf",
    "GITHUB_TOKEN": "gh",
    "OPENAI_API_KEY": "host-openai-key",
}


@pytest.mark.parametrize("kind", KINDS)
def test_environment_is_an_allow_list(
    kind: type[LocalRuntime], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("RR_NAMED_BY_THE_TASK", "passed")

    async def main() -> dict[str, str]:
        rt = kind(root=str(tmp_path), env={"FROM_RUNTIME": "1"}, pass_env=["RR_NAMED_BY_THE_TASK"])
        async with running(rt):
            r = await rt.exec(["env"], env={"FROM_EXEC": "2", "OPENAI_API_KEY": "declared"})
            assert r.exit_code == 0, r.stderr
            return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)

    env = run(main)
    assert [k for k in SECRETS if k in env and env[k] == SECRETS[k]] == []
    assert env["OPENAI_API_KEY"] == "declared"  # what the exec declares is passed
    assert (env["LANG"], env["RR_NAMED_BY_THE_TASK"], env["FROM_RUNTIME"], env["FROM_EXEC"]) == (
        "C.UTF-8",
        "passed",
        "1",
        "2",
    )
    assert "/usr/bin" in env["PATH"].split(":")
    assert set(env) <= {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TERM",
        "TZ",
        "TMPDIR",
        "PWD",
        "SHLVL",
        "_",
        "RR_NAMED_BY_THE_TASK",
        "FROM_RUNTIME",
        "FROM_EXEC",
        "OPENAI_API_KEY",
        "ROLLOUT_RAY_RUNTIME",
        "ROLLOUT_RAY_EXEC",
    }


# -- §2 read / write never follow what a program planted ------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_read_and_write_never_follow_planted_links(kind: type[LocalRuntime], tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "dir").mkdir()
    precious = host / "precious.txt"
    precious.write_text("precious")
    secret = host / "secret"
    secret.write_text("s3cret")
    secret.chmod(0o000)
    plant = (
        f"ln -s {precious} answer.txt; ln -s {host / 'dir'} sub; ln -s {secret} secret; "
        f"mkdir d; ln -s {host / 'dir'} d/inner; ln -s {precious} /tmp/answer.txt; "
        f"ln -s sub/../answer.txt relative"
    )

    async def main() -> None:
        (tmp_path / "rt").mkdir()
        async with running(kind(root=str(tmp_path / "rt"))) as rt:
            r = await rt.exec(["sh", "-c", plant])
            assert r.exit_code == 0, r.stderr
            targets = [
                "answer.txt",
                "sub/new.txt",
                "d/inner/new.txt",
                "d/../answer.txt",
                "relative",
                os.path.join(rt.workdir, "answer.txt"),
            ]
            if kind is not LocalRuntime:
                targets.append("/tmp/answer.txt")  # the sandbox's own /tmp: the same rules
            for target in targets:
                with pytest.raises(SandboxError, match="symbolic link"):
                    await rt.write(target, "overwritten")
                with pytest.raises((SandboxError, FileNotFoundError)):
                    await rt.read(target)
            with pytest.raises(SandboxError, match="'(work/)?secret' is a symbolic link"):  # image: from /
                await rt.read("secret")
            await rt.write("plain/file.txt", "fine")  # ordinary files still work
            assert await rt.read("plain/file.txt") == b"fine"

    run(main)
    assert precious.read_text() == "precious"
    assert os.listdir(host / "dir") == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_planted_fifo_fails_fast(kind: type[LocalRuntime], tmp_path: Path) -> None:
    async def main() -> None:
        async with running(kind(root=str(tmp_path))) as rt:
            r = await rt.exec(["mkfifo", "pipe"])
            assert r.exit_code == 0, r.stderr
            pipe = host_path(rt, "pipe")
            try:
                async with asyncio.timeout(5):  # a blocking open would hang the runtime
                    with pytest.raises(SandboxError, match="'(work/)?pipe' is not a regular file"):
                        await rt.read("pipe")
                    with pytest.raises(SandboxError, match="'(work/)?pipe' is not a regular file"):
                        await rt.write("pipe", "x")
            finally:  # release a thread still blocked in open(), whichever end it waits for
                for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):
                    with contextlib.suppress(OSError):
                        os.close(os.open(pipe, flags))

    run(main)


# -- §2 disk ------------------------------------------------------------------------------------


class Echo(Task):
    pass


@pytest.mark.parametrize("box", BOXES)
@needs_sandbox
def test_disk_limit_fails_the_exec_and_spares_the_host(box: Callable[..., SandboxRuntime], tmp_path: Path) -> None:
    limit = 16 * MiB

    def host_free() -> int:
        st = os.statvfs(tmp_path)
        return st.f_bavail * st.f_frsize

    async def main() -> None:
        before = host_free()
        async with running(box(root=str(tmp_path), disk_limit=limit)) as rt:
            with pytest.raises(SandboxError, match=f"disk limit of {limit} bytes reached"):
                await rt.exec(["sh", "-c", "head -c 268435456 /dev/zero > big"], timeout=30)
            assert os.path.getsize(host_path(rt, "big")) <= limit
            assert host_free() > before - 64 * MiB  # 256 MiB were written: not to the host
            with pytest.raises(SandboxError, match="disk limit"):
                await rt.write("more.bin", b"x" * MiB)
            assert (await rt.exec(["rm", "big"])).exit_code == 0  # room again: it runs
            with pytest.raises(SandboxError, match="disk limit"):
                await rt.write("huge.bin", b"x" * (2 * limit))
            await rt.exec(["rm", "huge.bin"])
            with pytest.raises(SandboxError, match="disk limit"):  # /tmp counts too
                await rt.exec(["sh", "-c", "head -c 33554432 /dev/zero > /tmp/big"], timeout=30)
            if box is image_sandbox:  # and so does the rest of an image's root
                await rt.exec(["rm", "/tmp/big"])
                with pytest.raises(SandboxError, match="disk limit"):
                    await rt.exec(["sh", "-c", "head -c 33554432 /dev/zero > /usr/lib/big"], timeout=30)
            assert mounts_under(str(tmp_path), rt) != []
            holder = getattr(rt, "_ns", None)
        assert mounts_under(str(tmp_path)) == [] and os.listdir(tmp_path) == []
        assert holder is None or not holder.alive()  # an image's namespace went with its holder

    run(main)


@pytest.mark.parametrize("box", BOXES)
@needs_sandbox
def test_filling_the_disk_fails_the_rollout_with_sandbox_error(
    box: Callable[..., SandboxRuntime], tmp_path: Path
) -> None:
    async def main() -> Any:
        async with HTTPInterception() as proxy:
            return await Rollout(
                Echo({"prompt": "hi"}),
                ProgramHarness(["sh", "-c", "head -c 67108864 /dev/zero > big"]),
                model=ScriptedModel(default="x"),
                interception=proxy,
                runtime_factory=lambda name: box(name, root=str(tmp_path), disk_limit=16 * MiB),
            ).run()

    trace = run(main)
    assert [e.type for e in trace.errors] == ["SandboxError"] and not trace.ok
    assert "disk limit of 16777216 bytes reached" in trace.errors[0].message
    assert os.listdir(tmp_path) == []


# -- §2 a dead host leaves no cgroup and no mount --------------------------------------------


HOST_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, subprocess, sys, time
    from rollout_ray._runtimes.host import RuntimeHost

    async def main():
        host = RuntimeHost(kind="sandbox" if sys.argv[1] == "image" else sys.argv[1])
        runtimes = []
        for name in ("a", "b"):
            await host.create_started(name, owner="x", image=sys.argv[2] if sys.argv[1] == "image" else None)
            runtimes.append(host._runtimes[name])
        held = [asyncio.ensure_future(host.exec(n, ["sh", "-c", "setsid env -i /bin/sleep 1000 & exec sleep 1000"]))
                for n in ("a", "b")]
        deadline = time.monotonic() + 10
        count = 2 if sys.argv[1] == "local" else 4  # the sleeps; in a sandbox bwrap and its init too
        while any(len(rt._cgroups.pids()) < count for rt in runtimes):
            assert time.monotonic() < deadline, "the programs did not start"
            await asyncio.sleep(0.01)
        cgroups = [d for rt in runtimes for d in rt._cgroups.dirs]
        cgroups += list(getattr(getattr(host, "_cgroups", None), "dirs", []))
        pids = sorted(p for rt in runtimes for p in rt._cgroups.pids())
        # A sandbox's mounts are in its own namespace, held by this process's descriptors (mount_ns.py).
        spaces = [rt._ns for rt in runtimes if getattr(rt, "_ns", None) is not None]
        tables = [open("/proc/self/mountinfo").read(), *(subprocess.run([*ns.enter_args(), "cat", "/proc/self/mountinfo"],
                                                                         capture_output=True, text=True, check=True).stdout
                                                          for ns in spaces)]
        print(json.dumps({"root": host.root, "guardian": host.guardian_pid(), "cgroups": cgroups,
                          "pids": pids, "namespaces": len(spaces),
                          "mounts": [line.split()[4] for t in tables for line in t.splitlines()
                                     if line.split()[4].startswith(host.root + "/")]}), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@pytest.mark.parametrize(
    "kind", ["local", pytest.param("sandbox", marks=needs_sandbox), pytest.param("image", marks=needs_image)]
)
def test_a_killed_host_leaves_no_process_cgroup_mount_or_file(kind: str, tmp_path: Path) -> None:
    """And for an image sandbox, no lease on its image: the cache can evict it at once."""
    from rollout_ray._runtimes.image_cache import ImageCache

    image = str(rootfs_tarball(busybox_rootfs(), tmp_path / "busybox.tar.gz"))
    cache = ImageCache(str(tmp_path / "cache"))
    host = subprocess.Popen(
        [sys.executable, "-c", HOST_SCRIPT, kind, image],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "ROLLOUT_RAY_IMAGE_CACHE": cache.root},
    )
    facts: dict[str, Any] = {}
    try:
        facts = json.loads(host.stdout.readline())  # type: ignore[union-attr]
        assert facts["cgroups"] and all(os.path.isdir(d) for d in facts["cgroups"])
        host.send_signal(signal.SIGKILL)  # by pid: the process we started
        host.wait()
        wait_exit(facts["guardian"], timeout=10)
        assert [p for p in facts["pids"] if process_alive(p)] == []
        assert [d for d in facts["cgroups"] if os.path.exists(d)] == []
        assert mounts_under(facts["root"]) == [] and not os.path.exists(facts["root"])
        if kind == "image":  # the disk limit, the overlay, the run dir and the host's Python
            assert len(facts["mounts"]) >= 2 * 6 and facts["namespaces"] == 2
            assert ImageCache(cache.root, max_bytes=1).evict() != []
        else:
            assert len(facts["mounts"]) == (2 if kind == "sandbox" else 0)  # a disk limit per sandbox
    finally:
        host.kill()
        host.wait()
        host.stdout.close()  # type: ignore[union-attr]
        for pid in facts.get("pids", []):  # only if the guardian failed: ours to clean
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# -- §3 rollouts on one machine -----------------------------------------------------------------

SCAN = (
    "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f 2>/dev/null; done "
    "| grep -c '^OPENAI_API_KEY=victim-secret' || true"
)


def _hold(fifo: str) -> list[str]:
    """A victim program: says it runs (opening ``fifo`` blocks until the test reads it), then
    waits with its rollout's secret in its environment until its exec is cancelled."""
    return ["sh", "-c", f"echo running > {fifo}; exec sleep 60"]


def _secrets_seen(kind: str, root: Path, image: str | None = None) -> int:
    """How many processes holding another rollout's proxy secret a program of a ``kind``
    runtime (over ``image``, when given) finds in ``/proc`` (the victim runs beside it on the
    same host)."""
    from rollout_ray._runtimes.host import RuntimeHost

    async def scenario() -> int:
        host = RuntimeHost(str(root), kind=kind)
        try:
            await host.create_started("victim", owner="victim", image=image)
            await host.create_started("attacker", owner="attacker", image=image)
            runtime = host._runtimes["victim"]
            fifo = host_path(runtime, "running")  # type: ignore[arg-type]
            os.mkfifo(fifo)
            os.chmod(fifo, 0o666)
            inside = os.path.join(runtime.workdir, "running")  # type: ignore[attr-defined]
            held = asyncio.ensure_future(
                host.exec("victim", _hold(inside), env={"OPENAI_API_KEY": "victim-secret"}, timeout=60)
            )
            assert (await asyncio.to_thread(Path(fifo).read_text)).strip() == "running"
            found = int((await host.exec("attacker", ["sh", "-c", SCAN])).stdout.strip() or 0)
            held.cancel()
            with contextlib.suppress(asyncio.CancelledError, SandboxError):
                await held
            return found
        finally:
            await host.shutdown()

    return run(scenario)


@needs_sandbox
def test_the_default_runtime_keeps_rollouts_out_of_each_others_processes(tmp_path: Path) -> None:
    from rollout_ray._runtimes.host import runtime_kind

    assert runtime_kind("auto") == ("sandbox", None)  # the default, where the machine runs one
    assert _secrets_seen("auto", tmp_path) == 0


@needs_image
def test_image_sandboxes_keep_rollouts_out_of_each_others_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollout_ray._runtimes.image_cache import default_image_cache

    monkeypatch.setenv("ROLLOUT_RAY_IMAGE_CACHE", shared_cache().root)  # a host uses the node's cache
    default_image_cache.cache_clear()
    try:
        assert _secrets_seen("sandbox", tmp_path, image=python_image()) == 0
    finally:
        default_image_cache.cache_clear()


def test_the_local_runtime_does_not_isolate_rollouts(tmp_path: Path) -> None:
    """Why ``local`` is not the default: its programs read a sibling's secret (and could put
    turns on its trace). The CLI and the log say so when ``auto`` has to fall back to it."""
    assert _secrets_seen("local", tmp_path) == 1


# -- §3 LocalRuntime.stop kills everything it started ----------------------------------------


def test_local_stop_kills_a_process_that_left_its_session_and_cleared_its_environment(tmp_path: Path) -> None:
    pids: list[int] = []

    async def main() -> None:
        async with running(LocalRuntime(root=str(tmp_path))) as rt:
            script = (
                "setsid env -i /bin/sleep 1000 >/dev/null 2>&1 & echo $!; "
                "setsid sh -c 'exec env -i /bin/sleep 1000' >/dev/null 2>&1 & echo $!"
            )
            r = await rt.exec(["sh", "-c", script])
            pids.extend(int(p) for p in r.stdout.split())
            assert len(pids) == 2 and all(process_alive(p) for p in pids)

    try:
        run(main)
        for pid in pids:
            wait_exit(pid, timeout=5)
    finally:
        for pid in pids:  # only if stop failed: ours to clean
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


CYCLES = 300
BATCH = 10
BACKGROUND = "setsid /bin/sleep 1000 >/dev/null 2>&1 & setsid /bin/sleep 1000 >/dev/null 2>&1 &"


@pytest.mark.slow  # ~3-6 s: 300 runtimes started, used and stopped
def test_local_spawn_then_stop_never_leaves_a_process(tmp_path: Path) -> None:
    """CYCLES cycles, BATCH at a time: stop right after an exec left children behind (some
    still in execve), or while an exec is being spawned. Nothing may survive."""
    tokens: list[str] = []

    async def cycle(during_spawn: bool) -> None:
        rt = LocalRuntime(root=str(tmp_path))
        await rt.start()
        tokens.append(rt._token)
        if not during_spawn:
            await rt.exec(["sh", "-c", BACKGROUND])
            await rt.stop()
            return
        task = asyncio.ensure_future(rt.exec(["sh", "-c", BACKGROUND + " wait"]))
        await asyncio.sleep(0)  # the exec is being spawned
        await rt.stop()
        async with asyncio.timeout(10):
            with contextlib.suppress(SandboxError):
                await task

    async def main() -> None:
        for first in range(0, CYCLES, BATCH):
            await asyncio.gather(*(cycle(during_spawn=bool(i % 2)) for i in range(first, first + BATCH)))

    left: list[int] = []
    try:
        run(main)
    finally:
        for token in tokens:
            left += pids_with_marker(RUNTIME_MARKER, token)
        for pid in left:  # ours: report, then clean
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert left == [] and os.listdir(tmp_path) == []
