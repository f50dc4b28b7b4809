"""Issue 32 §1: each sandbox mounts (its disk limit, an image's root) in a namespace of its own,
which its execs enter, so the mount table an exec copies does not grow with the number of
live sandboxes."""

from __future__ import annotations

import asyncio
import os
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
