"""RuntimeHost and its guardian: ownership, and nothing left behind when the host dies.

These follow host pids and paths, so the hosts make ``local`` runtimes; the sandbox kind has
its own tests (test_sandbox_runtime, test_hardening)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from rollout_ray._errors import RuntimeStopped
from rollout_ray._runtimes.host import RuntimeHost

from conftest import process_alive as _alive
from conftest import wait_exit as _wait_exit


def test_runtimes_are_created_started_used_and_stopped_by_name() -> None:
    async def main() -> None:
        host = RuntimeHost(kind="local")
        try:
            info = await host.create("r1", owner="rollout-a")
            assert (info.name, info.type) == ("r1", "local")
            started = await host.start("r1")
            assert started.id.startswith(host.root)
            result = await host.exec("r1", ["sh", "-c", "echo $ROLLOUT_RAY_HOST"])
            assert result.stdout.strip() == host.token
            await host.write("r1", "a.txt", "hello")
            assert await host.read("r1", "a.txt") == b"hello"
            assert await host.alive("r1") and host.owner("r1") == "rollout-a"
            await host.stop("r1")
            assert await host.stopped("r1") and not await host.alive("r1")
            with pytest.raises(RuntimeStopped, match=r"^runtime 'r1' is stopped or unknown on this host$"):
                await host.exec("r1", ["true"])
            with pytest.raises(ValueError, match=r"^runtime 'r1' already exists on this host$"):
                await host.create("r1")
        finally:
            await host.shutdown()
        assert not os.path.exists(host.root)

    asyncio.run(main())


def test_stop_owned_by_stops_only_that_owners_runtimes() -> None:
    async def main() -> None:
        host = RuntimeHost(kind="local")
        try:
            for name, owner in (("a1", "A"), ("a2", "A"), ("b1", "B")):
                await host.create(name, owner=owner)
                await host.start(name)
            assert sorted(await host.stop_owned_by("A")) == ["a1", "a2"]
            assert host.names() == ["b1"]
            assert host.statistics() == {"runtimes": 1, "owners": 1}
        finally:
            await host.shutdown()

    asyncio.run(main())


HOST_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    from rollout_ray._runtimes.host import RuntimeHost

    async def main():
        host = RuntimeHost(kind="local")
        await host.create("r", owner="x")
        await host.start("r")
        out = await host.exec("r", ["sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 & echo $!"])
        print(json.dumps({"root": host.root, "sleeper": int(out.stdout), "guardian": host.guardian_pid()}), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


def test_guardian_removes_processes_and_files_when_the_host_is_killed() -> None:
    host = subprocess.Popen([sys.executable, "-c", HOST_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        facts = json.loads(host.stdout.readline())  # type: ignore[union-attr]
        assert _alive(facts["sleeper"]) and os.path.isdir(facts["root"])
        host.send_signal(signal.SIGKILL)
        host.wait()
        _wait_exit(facts["guardian"], timeout=5)
        assert not _alive(facts["sleeper"])
        assert not os.path.exists(facts["root"])
    finally:
        host.kill()
        host.wait()
        host.stdout.close()  # type: ignore[union-attr]


def test_stopped_runtimes_are_forgotten() -> None:
    async def main() -> None:
        host = RuntimeHost(kind="local")
        try:
            for i in range(20):
                await host.create_started(f"r{i}", owner="x")
                await host.stop(f"r{i}")
            assert host._runtimes == {} and host._owners == {}
            assert await host.stopped("r3")
        finally:
            await host.shutdown()

    asyncio.run(main())
