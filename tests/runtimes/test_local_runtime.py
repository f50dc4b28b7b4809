"""LocalRuntime: exec, output caps, process-tree kills, files, lifecycle."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
import time

import pytest

from rollout_ray._errors import SandboxError
from rollout_ray._runtimes.guardian import pids_with_marker
from rollout_ray._runtimes.local import EXEC_MARKER, RUNTIME_MARKER, LocalRuntime

from conftest import process_alive as alive


def pids_in(text: str) -> list[int]:
    return [int(tok) for tok in text.split()]


def fifo(path: str) -> str:
    """A named pipe a program will write to: reading it waits for the write (no polling)."""
    os.mkfifo(path)
    return path


async def read_fifo(path: str, timeout: float = 10.0) -> str:
    """Block (in a thread) until a writer opens ``path``, then read what it wrote."""

    def read() -> str:
        with open(path) as f:
            return f.read()

    async with asyncio.timeout(timeout):
        return await asyncio.to_thread(read)


async def started(rt: LocalRuntime) -> LocalRuntime:
    await rt.start()
    return rt


def test_exec_runs_in_workdir_with_filtered_env(monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_API_KEY", "host-secret")
    monkeypatch.setenv("my_api_key_lower", "host-secret")
    monkeypatch.setenv("ROLLOUT_RAY_KEEP", "host")

    async def main():
        rt = LocalRuntime("t1", root=str(tmp_path), env={"CTOR_VAR": "ctor", "CTOR_API_KEY": "ok"})
        try:
            await rt.start()
            assert os.path.dirname(rt.id) == str(tmp_path)
            assert stat.S_IMODE(os.stat(rt.id).st_mode) == 0o700
            r = await rt.exec(["sh", "-c", "pwd; echo oops >&2; exit 3"])
            assert (r.exit_code, r.stdout, r.stderr) == (3, rt.id + "\n", "oops\n")
            assert not (r.timed_out or r.stdout_truncated or r.stderr_truncated)

            r = await rt.exec(["env"], env={"CALL_VAR": "call", "CTOR_VAR": "overridden"})
            env = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
            assert "FAKE_API_KEY" not in env and "my_api_key_lower" not in env
            assert env["CTOR_API_KEY"] == "ok"  # explicitly given: passed through
            assert "ROLLOUT_RAY_KEEP" not in env  # an allow-list: host variables stay unless named
            assert env["HOME"] == os.environ["HOME"]
            assert env["CALL_VAR"] == "call" and env["CTOR_VAR"] == "overridden"
            r2 = await rt.exec(["env"])
            env2 = dict(line.split("=", 1) for line in r2.stdout.splitlines() if "=" in line)
            assert env2["CTOR_VAR"] == "ctor" and "CALL_VAR" not in env2
            assert env[RUNTIME_MARKER] == env2[RUNTIME_MARKER]
            assert env[EXEC_MARKER] != env2[EXEC_MARKER]

            r = await rt.exec(["cat"], stdin=b"fed via stdin", timeout=5)
            assert r.stdout == "fed via stdin"
            r = await rt.exec(["printf", "\\377ok"])
            assert r.stdout == "\ufffdok"  # invalid UTF-8 is replaced, not fatal
        finally:
            await rt.stop()

    asyncio.run(main())


SPAWN_TREE = """
sleep 1000 & echo $!
setsid sleep 1000 & echo $!
sh -c 'setsid sleep 1000 & echo $!'
env -i /bin/sleep 1000 & echo $!
echo started >&2
sleep 1000
"""


def test_timeout_kills_whole_tree(tmp_path):
    async def main():
        rt = await started(LocalRuntime(root=str(tmp_path)))
        try:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            r = await rt.exec(["sh", "-c", SPAWN_TREE], timeout=0.5)
            assert loop.time() - t0 < 1.5
            assert r.timed_out and r.exit_code == -9
            assert r.stderr == "started\n"  # output so far is kept
            pids = pids_in(r.stdout)
            assert len(pids) == 4  # the last one dropped the markers: only killpg finds it
            assert not [p for p in pids if alive(p)]
            assert pids_with_marker(RUNTIME_MARKER, rt._token) == []
            assert await rt.alive()  # the runtime itself is still usable
        finally:
            await rt.stop()

    asyncio.run(main())


def test_output_over_cap_is_truncated_and_drained(tmp_path):
    async def main():
        rt = await started(LocalRuntime(root=str(tmp_path)))
        try:
            script = "head -c 5000000 /dev/zero | tr '\\0' x\nhead -c 3000000 /dev/zero >&2\necho finished > done\n"
            r = await rt.exec(["sh", "-c", script], max_output=1000, timeout=10)
            assert not r.timed_out and r.exit_code == 0
            assert await rt.read("done") == b"finished\n"  # ran to the end, never blocked
            assert r.stdout == "x" * 1000 and r.stdout_truncated
            assert len(r.stderr) == 1000 and r.stderr_truncated
            r = await rt.exec(["sh", "-c", "printf 12345"], max_output=5)
            assert r.stdout == "12345" and not r.stdout_truncated
        finally:
            await rt.stop()

    asyncio.run(main())


def test_stop_kills_leftovers_and_removes_workdir(tmp_path):
    async def main():
        rt = await started(LocalRuntime(root=str(tmp_path)))
        try:
            script = (
                "setsid sleep 1000 >/dev/null 2>&1 & echo $!\n"
                "sleep 1000 >/dev/null 2>&1 & echo $!\n"
                "mkdir -p ro/sub && touch ro/sub/f && chmod 500 ro/sub ro\n"
            )
            r = await rt.exec(["sh", "-c", script], timeout=5)
            assert r.exit_code == 0 and not r.timed_out
            pids = pids_in(r.stdout)
            assert len(pids) == 2
            assert all(alive(p) for p in pids)  # a normal exit leaves servers running

            # A leftover still holding stdout delays exec by at most the exit grace.
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            r = await rt.exec(["sh", "-c", "sleep 1000 & echo $!"], timeout=5)
            assert not r.timed_out and loop.time() - t0 < 1.5
            pids += pids_in(r.stdout)
            assert alive(pids[-1])

            workdir = rt.id
            await rt.stop()
            assert not [p for p in pids if alive(p)]
            assert not os.path.exists(workdir)
            await rt.stop()  # idempotent
            with pytest.raises(SandboxError, match="stopped"):
                await rt.exec(["true"])
            with pytest.raises(SandboxError):
                await rt.read("x")
            assert not await rt.alive()
        finally:
            await rt.stop()

    asyncio.run(main())


def test_files_paths_and_errors(tmp_path):
    async def main():
        rt = LocalRuntime("files", root=str(tmp_path))
        try:
            with pytest.raises(SandboxError, match="not started"):
                await rt.exec(["true"])
            with pytest.raises(SandboxError):
                await rt.write("a.txt", "x")
            assert rt.id == "files"
            await rt.stop()  # never started: nothing to tear down
        finally:
            await rt.stop()

        rt = await started(LocalRuntime("files", root=str(tmp_path)))
        try:
            await rt.write("a/b/c.txt", "héllo")
            assert await rt.read("a/b/c.txt") == "héllo".encode()
            assert await rt.read("a/b/c.txt", max_bytes=2) == b"h\xc3"
            r = await rt.exec(["cat", "a/b/c.txt"])
            assert r.stdout == "héllo"
            await rt.write("./a/../raw.bin", b"\x00\x01")
            assert await rt.read(os.path.join(rt.id, "raw.bin")) == b"\x00\x01"

            outside = str(tmp_path / "outside.txt")  # absolute paths: not a sandbox
            await rt.write(outside, "abs")
            assert (tmp_path / "outside.txt").read_text() == "abs"

            for bad in ("../escape.txt", "a/../../escape.txt"):
                with pytest.raises(ValueError, match="escape"):
                    await rt.write(bad, "x")
                with pytest.raises(ValueError, match="escape"):
                    await rt.read(bad)
            assert not (tmp_path / "escape.txt").exists()

            with pytest.raises(SandboxError, match="no-such-program-xyz.*files"):
                await rt.exec(["no-such-program-xyz", "--flag"])
        finally:
            await rt.stop()

    asyncio.run(main())


def test_cancelled_exec_kills_tree(tmp_path):
    async def main():
        rt = await started(LocalRuntime(root=str(tmp_path)))
        try:
            script = 'sleep 1000 & a=$!\nsetsid sleep 1000 & b=$!\necho "$$ $a $b" > pids\nwait\n'
            channel = fifo(os.path.join(rt.id, "pids"))
            task = asyncio.create_task(rt.exec(["sh", "-c", script]))
            pids = pids_in(await read_fifo(channel))
            assert len(pids) == 3 and all(alive(p) for p in pids)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not [p for p in pids if alive(p)]
        finally:
            await rt.stop()

    asyncio.run(main())


def test_cancel_during_spawn_kills_tree(tmp_path):
    async def main():
        rt = await started(LocalRuntime(root=str(tmp_path)))
        try:
            pid_file = os.path.join(rt.id, "p")
            script = "sleep 1000 & echo $! > p.tmp && mv p.tmp p; wait"
            task = asyncio.create_task(rt.exec(["sh", "-c", script]))
            await asyncio.sleep(0)  # exec schedules its spawn
            await asyncio.sleep(0)  # the spawn forks, then waits for its pipes to connect
            # Block the loop (no await) so the pipes cannot connect before the cancel.
            deadline = time.monotonic() + 5
            while not os.path.exists(pid_file):
                assert time.monotonic() < deadline
            with open(pid_file) as f:
                pid = int(f.read())
            task.cancel()
            async with asyncio.timeout(3):  # asyncio alone would wait on the child's pipes
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert not alive(pid)
            assert pids_with_marker(RUNTIME_MARKER, rt._token) == []
        finally:
            await rt.stop()

    asyncio.run(main())


def test_stop_during_spawn_raises(tmp_path):
    async def main():
        rt = await started(LocalRuntime(root=str(tmp_path)))
        try:
            script = "setsid sleep 1000 & echo $!; wait"
            task = asyncio.create_task(rt.exec(["sh", "-c", script]))
            await asyncio.sleep(0)  # the exec forked and waits for its pipes to connect
            await rt.stop()
            with pytest.raises(SandboxError, match="stopped"):
                await task
            assert pids_with_marker(RUNTIME_MARKER, rt._token) == []
        finally:
            await rt.stop()

    asyncio.run(main())


def test_stop_during_exec_kills_it_and_raises(tmp_path):
    async def main():
        rt = await started(LocalRuntime(root=str(tmp_path)))
        try:
            script = "setsid sleep 1000 & echo $! > p; wait"
            channel = fifo(os.path.join(rt.id, "p"))
            task = asyncio.create_task(rt.exec(["sh", "-c", script]))
            pid = int(await read_fifo(channel))
            await rt.stop()
            with pytest.raises(SandboxError, match="stopped"):
                await task
            assert not alive(pid)
        finally:
            await rt.stop()

    asyncio.run(main())


class _GatedWatcher(asyncio.ThreadedChildWatcher):  # type: ignore[name-defined,misc]
    """asyncio's own child watcher, reaping each child only once ``gate`` is set: the order a
    loaded machine can give (the watcher's thread late) made deterministic."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def _do_waitpid(self, loop, expected_pid, callback, args):  # type: ignore[no-untyped-def]
        self.gate.wait(60)
        super()._do_waitpid(loop, expected_pid, callback, args)


def _zombie_or_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not hasattr(asyncio, "ThreadedChildWatcher"), reason="asyncio without child watchers (3.14+)")
def test_a_stop_during_an_exec_raises_whenever_the_child_is_reaped(tmp_path):
    """Issue 28: stop() killed the program, then closed its transport, whose Popen.poll() reaped
    the child first when asyncio's watcher was late; the watcher then reported exit 255 and the
    exec returned it instead of raising. Here the watcher is held until stop() has killed it."""
    import warnings

    watcher = _GatedWatcher()

    async def main():
        rt = await started(LocalRuntime(root=str(tmp_path)))
        ready = fifo(os.path.join(rt.id, "ready"))
        running = asyncio.ensure_future(rt.exec(["sh", "-c", "echo $$ > ready; exec sleep 1000"], timeout=60))
        pid = int(await read_fifo(ready))
        stopping = asyncio.ensure_future(rt.stop())
        async with asyncio.timeout(30):  # stop() kills it; it stays a zombie until reaped
            while not _zombie_or_gone(pid):
                await asyncio.sleep(0.01)
        watcher.gate.set()
        await stopping
        with pytest.raises(SandboxError, match="killed: runtime .* stopped"):
            await running

    policy = asyncio.get_event_loop_policy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        previous = policy.get_child_watcher()
        try:
            policy.set_child_watcher(watcher)
            asyncio.run(main())
        finally:
            watcher.gate.set()
            policy.set_child_watcher(previous)
