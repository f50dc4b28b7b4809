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
from image_rig import BOXES, ns_mountinfo

from rollout_ray._runtimes.sandbox import SandboxRuntime, sandbox_unavailable

pytestmark = pytest.mark.skipif(sandbox_unavailable() is not None, reason=f"no sandbox: {sandbox_unavailable()}")


def mounts_in(table: str, root: str) -> list[str]:
    """Mount points at or under ``root`` in mount table ``table`` (``mountinfo``'s text)."""
    points = [line.split()[4] for line in table.splitlines()]
    return [p for p in points if p == root or p.startswith(root.rstrip("/") + "/")]


def host_table() -> str:
    with open("/proc/self/mountinfo") as f:
        return f.read()


@pytest.mark.parametrize("box", BOXES)
def test_each_sandbox_mounts_only_in_its_own_namespace(box: Callable[..., SandboxRuntime], tmp_path: Path) -> None:
    async def main() -> None:
        boxes = [box(f"box-{i}", root=str(tmp_path)) for i in range(3)]
        image = boxes[0].image is not None
        try:
            await asyncio.gather(*(rt.start() for rt in boxes))
            assert mounts_in(host_table(), str(tmp_path)) == []  # none in the host's table
            for rt in boxes:
                assert rt._ns is not None
                own = mounts_in(ns_mountinfo(rt._ns), str(tmp_path))
                # its disk limit (and an image's root, pinned binds, kit), nothing of the others'
                base = rt._base or ""
                assert len(own) >= (4 if image else 1) and all(p == base or p.startswith(base + "/") for p in own)
                await rt.write("mine", rt.name)  # through the holder's root
                kit = '; test -n "$(ls /.rollout-ray/host)" && echo kit' if image else "; echo kit"
                seen = await rt.exec(["sh", "-c", "cat mine" + kit])
                assert (seen.exit_code, seen.stdout) == (0, f"{rt.name}kit\n"), seen
            holders = [rt._ns for rt in boxes]
        finally:
            await asyncio.gather(*(rt.stop() for rt in boxes))
        assert [h for h in holders if h is not None and h.alive()] == []  # every namespace let go
        assert os.listdir(tmp_path) == []

    asyncio.run(main())


def live_children(parent: int) -> list[int]:
    """Processes (not zombies) whose parent is ``parent``."""
    found = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            found.append(int(p))
    return found


def test_namespaces_are_forked_by_one_server_and_held_by_no_process(tmp_path: Path) -> None:
    """A Python started per sandbox cost ~25 ms of each start, and a holder process per
    sandbox made every exec's ``pivot_root`` walk one more task: the namespaces are made by a
    fork of the process's one mounter server and held by this process's descriptors alone; a
    failing op raises as the mount did and leaves nothing; a dead server is started anew."""
    from rollout_ray._runtimes import mount_ns
    from rollout_ray._runtimes.disk import PAGE

    dirs = [tmp_path / n for n in "abc"]
    for d in dirs:
        d.mkdir()
    mount_ns.MountNamespace([]).close()  # the server started
    assert mount_ns._server is not None
    server = mount_ns._server.proc.pid
    held = [mount_ns.MountNamespace([["tmpfs", str(d), 1 << 20, PAGE], ["mkdir", f"{d}/in", 0o700]]) for d in dirs[:2]]
    try:
        # each maker ended once the namespace was held: no process per namespace is left
        assert live_children(server) == []
        for ns, d in zip(held, dirs):
            assert mounts_in(ns_mountinfo(ns), str(d)) == [str(d)]
            assert os.path.isdir(ns.path(f"{d}/in")) and not (d / "in").exists()
        ns.run([["mkdir", f"{dirs[1]}/in/deeper", 0o700]])  # entered by a fork too
        assert os.path.isdir(ns.path(f"{dirs[1]}/in/deeper"))
        with pytest.raises(OSError) as failed:
            mount_ns.MountNamespace([["mkdir", str(tmp_path / "none" / "x"), 0o700]])
        assert failed.value.errno == errno.ENOENT and str(tmp_path / "none") in str(failed.value)
        os.kill(server, signal.SIGKILL)  # the server is this process's own
        mount_ns._server.proc.wait()
        again = mount_ns.MountNamespace([["tmpfs", str(dirs[2]), 1 << 20, PAGE]])
        held.append(again)
        assert mount_ns._server.proc.pid != server
        assert all(ns.alive() for ns in held) and mounts_in(ns_mountinfo(held[0]), str(dirs[0])) == [str(dirs[0])]
    finally:
        for ns in held:
            ns.close()
    assert not any(ns.alive() for ns in held)
    assert mounts_in(host_table(), str(tmp_path)) == []
