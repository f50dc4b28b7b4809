"""Issue 32 §3: what of the host an image sandbox sees — only what its task asked for.

The red team found the host Python's whole installation (224 entries of its site-packages)
and host paths (the image cache's, the runtime's, the host's library directory) in an image
sandbox's view and mount table. The host's Python is there only to relay routes: the
sandbox sees the files the relay runs with, and no host path names a mount.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from image_rig import image_sandbox, needs_image, shared_cache

pytestmark = [needs_image]


def test_an_image_sandbox_sees_no_host_package_and_no_host_path(tmp_path: Path) -> None:
    script = (
        "find /.rollout-ray/host -name '*-packages' -o -name '*.dist-info' | head -5; echo ---; "
        "find /.rollout-ray/host -type f | wc -l; echo ---; cat /proc/self/mountinfo"
    )

    async def main() -> tuple[str, str]:
        rt = image_sandbox(root=str(tmp_path))
        await rt.start()
        try:
            await rt.prepare_execution(["http://127.0.0.1:9999/"])  # the relay runs in every exec
            result = await rt.exec(["sh", "-c", script])
            assert result.exit_code == 0, result.stderr
            relay = await rt.exec(["true"])
            assert relay.exit_code == 0, relay.stderr  # the host's Python still runs inside
            return result.stdout, result.stderr
        finally:
            await rt.stop()

    out, _ = asyncio.run(main())
    packages, files, mounts = out.split("---\n")
    assert packages == "", packages
    assert int(files) < 400, files  # the relay's modules and libraries, not an installation
    host = {
        shared_cache().root,
        str(tmp_path),
        os.path.realpath(sys.base_prefix),
        sys.base_prefix,
        sys.prefix,
        os.path.expanduser("~"),
        "/usr/lib",
        "/lib/",
    }
    leaked = [(path, line) for line in mounts.splitlines() for path in host if path in line]
    assert leaked == [], leaked


def test_the_kit_holds_the_library_a_relay_thread_needs_to_end() -> None:
    """The relay's threads end, and glibc then loads ``libgcc_s`` (pthread_exit's unwinder)
    lazily: a kit without it aborted the relay, 1 rollout in 16 on a loaded machine ("libgcc_s.so.1
    must be installed for pthread_exit to work", exit 134)."""
    from rollout_ray._runtimes.kit import host_kit

    files, _ = host_kit()
    assert any(os.path.basename(host).startswith("libgcc_s") for host, _inside in files)
