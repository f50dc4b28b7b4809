"""Issue 32 §1: each sandbox mounts (its disk limit, an image's root) in a namespace of its own,
which its execs enter, so the mount table an exec copies does not grow with the number of
live sandboxes."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from image_rig import BOXES

from rollout_ray._runtimes.sandbox import SandboxRuntime, sandbox_unavailable

pytestmark = pytest.mark.skipif(sandbox_unavailable() is not None, reason=f"no sandbox: {sandbox_unavailable()}")


def mounts_in(table: str, root: str) -> list[str]:
    """Mount points at or under ``root`` in mount table ``table`` (a ``mountinfo`` file)."""
    with open(table) as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if p == root or p.startswith(root.rstrip("/") + "/")]


@pytest.mark.parametrize("box", BOXES)
def test_each_sandbox_mounts_only_in_its_own_namespace(box: Callable[..., SandboxRuntime], tmp_path: Path) -> None:
    async def main() -> None:
        boxes = [box(f"box-{i}", root=str(tmp_path)) for i in range(3)]
        image = boxes[0].image is not None
        try:
            await asyncio.gather(*(rt.start() for rt in boxes))
            assert mounts_in("/proc/self/mountinfo", str(tmp_path)) == []  # none in the host's table
            for rt in boxes:
                assert rt._ns is not None
                own = mounts_in(f"/proc/{rt._ns.pid}/mountinfo", str(tmp_path))
                # its disk limit (and an image's root, pinned binds, kit), nothing of the others'
                base = rt._base or ""
                assert len(own) >= (4 if image else 1) and all(p == base or p.startswith(base + "/") for p in own)
                await rt.write("mine", rt.name)  # through the holder's root
                kit = "; test -n \"$(ls /.rollout-ray/host)\" && echo kit" if image else "; echo kit"
                seen = await rt.exec(["sh", "-c", "cat mine" + kit])
                assert (seen.exit_code, seen.stdout) == (0, f"{rt.name}kit\n"), seen
            holders = [rt._ns for rt in boxes]
        finally:
            await asyncio.gather(*(rt.stop() for rt in boxes))
        assert [h for h in holders if h is not None and h.alive()] == []  # every namespace went with its holder
        assert os.listdir(tmp_path) == []

    asyncio.run(main())


def test_namespaces_are_forked_by_one_server_not_a_python_each(tmp_path: Path) -> None:
    """A Python started per sandbox cost ~25 ms of each start: holders are forked by the
    process's one mounter server and are ``cat`` itself; a failing op raises as the mount did
    and leaves nothing; a dead server is started anew."""
    from rollout_ray._runtimes import mount_ns
    from rollout_ray._runtimes.disk import PAGE

    def parent(pid: int) -> int:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])

    dirs = [tmp_path / n for n in "abc"]
    for d in dirs:
        d.mkdir()
    held = [mount_ns.MountNamespace([["tmpfs", str(d), 1 << 20, PAGE], ["mkdir", f"{d}/in", 0o700]], {"X": "1"})
            for d in dirs[:2]]
    try:
        servers = {parent(ns.pid) for ns in held}
        assert len(servers) == 1 and os.getpid() not in servers
        (server,) = servers
        with open(f"/proc/{server}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[-3:-1] == [mount_ns._MOUNTER.encode(), b"serve"]
        for ns, d in zip(held, dirs):
            assert os.readlink(f"/proc/{ns.pid}/exe") == os.path.realpath(mount_ns._tool("cat"))
            with open(f"/proc/{ns.pid}/environ", "rb") as f:
                assert f.read() == b"X=1\0"  # the host's marker alone: its guardian finds it
            assert mounts_in(f"/proc/{ns.pid}/mountinfo", str(d)) == [str(d)]
            assert os.path.isdir(ns.path(f"{d}/in")) and not (d / "in").exists()
        with pytest.raises(OSError) as failed:
            mount_ns.MountNamespace([["mkdir", str(tmp_path / "none" / "x"), 0o700]], {})
        assert failed.value.errno == errno.ENOENT and str(tmp_path / "none") in str(failed.value)
        os.kill(server, signal.SIGKILL)  # the server is this process's own
        assert mount_ns._server is not None
        mount_ns._server.proc.wait()
        again = mount_ns.MountNamespace([["tmpfs", str(dirs[2]), 1 << 20, PAGE]], {})
        held.append(again)
        assert parent(again.pid) not in (server, os.getpid())
        assert all(ns.alive() for ns in held)  # a holder outlives the server that forked it
    finally:
        for ns in held:
            ns.close()
    assert not any(ns.alive() for ns in held)
    assert mounts_in("/proc/self/mountinfo", str(tmp_path)) == []
