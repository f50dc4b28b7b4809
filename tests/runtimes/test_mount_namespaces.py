"""Issue 32 §1: each image sandbox mounts in a namespace of its own, which its execs enter, so
the mount table an exec copies does not grow with the number of live sandboxes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from image_rig import image_sandbox, needs_image

from rollout_ray._runtimes.sandbox import SandboxRuntime

pytestmark = needs_image


def mounts_in(table: str, root: str) -> list[str]:
    """Mount points at or under ``root`` in mount table ``table`` (a ``mountinfo`` file)."""
    with open(table) as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if p == root or p.startswith(root.rstrip("/") + "/")]


def test_each_image_sandbox_mounts_only_in_its_own_namespace(tmp_path: Path) -> None:
    async def main() -> None:
        boxes: list[SandboxRuntime] = [image_sandbox(f"box-{i}", root=str(tmp_path)) for i in range(3)]
        try:
            await asyncio.gather(*(rt.start() for rt in boxes))
            assert mounts_in("/proc/self/mountinfo", str(tmp_path)) == []  # none in the host's table
            for rt in boxes:
                assert rt._ns is not None
                own = mounts_in(f"/proc/{rt._ns.pid}/mountinfo", str(tmp_path))
                # its disk limit, root, pinned binds and the kit, and nothing of the others'
                assert len(own) >= 4 and all(p == rt.id or p.startswith(rt.id + "/") for p in own), own
                await rt.write("mine", rt.name)  # through the holder's root
                seen = await rt.exec(["sh", "-c", "cat mine; test -n \"$(ls /.rollout-ray/host)\" && echo kit"])
                assert (seen.exit_code, seen.stdout) == (0, f"{rt.name}kit\n"), seen
            holders = [rt._ns for rt in boxes]
        finally:
            await asyncio.gather(*(rt.stop() for rt in boxes))
        assert [h for h in holders if h is not None and h.alive()] == []  # every namespace went with its holder
        assert os.listdir(tmp_path) == []

    asyncio.run(main())
