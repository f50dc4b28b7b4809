"""Issue 23 §5: cached layers in use and setup snapshots are held by leases that outlive no
owner — and that a dead owner's guardian keeps until it has unmounted them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from image_rig import busybox_rootfs, needs_image, rootfs_tarball

from rollout_ray._runtimes import image_cache
from rollout_ray._runtimes.guardian import mounts_under
from rollout_ray._runtimes.host import RuntimeHost
from rollout_ray._runtimes.image_cache import ImageCache

from conftest import wait_exit

pytestmark = [needs_image, pytest.mark.faults]

HOST = textwrap.dedent(
    """
    import asyncio, json, sys
    from rollout_ray._runtimes.host import RuntimeHost

    async def main():
        host = RuntimeHost(kind="sandbox")
        await host.create_started("builder", owner="x", image=sys.argv[1])
        await host.claim_setup("builder", "setup-key")
        await host.exec("builder", ["sh", "-c", "echo frozen > /state"])
        snapshot = await host.freeze_setup("builder")
        await host.create_started("user", owner="x", image=sys.argv[1])
        info = await host.claim_setup("user", "setup-key")
        assert info.snapshot == snapshot, (info, snapshot)
        print(json.dumps({"root": host.root, "guardian": host.guardian_pid(), "snapshot": snapshot}), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@pytest.fixture
def image(tmp_path: Path) -> str:
    return str(rootfs_tarball(busybox_rootfs(), tmp_path / "busybox.tar.gz"))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ImageCache]:
    """A private cache, which runtime hosts of this process and its children use."""
    cache = ImageCache(str(tmp_path / "cache"))
    monkeypatch.setenv("ROLLOUT_RAY_IMAGE_CACHE", cache.root)
    image_cache.default_image_cache.cache_clear()
    yield cache
    image_cache.default_image_cache.cache_clear()


@contextlib.contextmanager
def host_process(image: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    host = subprocess.Popen([sys.executable, "-c", HOST, image], stdout=subprocess.PIPE, text=True)
    facts: dict[str, Any] = {}
    try:
        facts.update(json.loads(host.stdout.readline()))  # type: ignore[union-attr]
        yield host, facts
    finally:
        host.kill()
        host.wait()
        host.stdout.close()  # type: ignore[union-attr]
        if "guardian" in facts:
            with contextlib.suppress(ProcessLookupError):
                os.kill(facts["guardian"], signal.SIGCONT)


def entries(cache: ImageCache) -> list[str]:
    return os.listdir(cache.snapshots._dir("entries"))


def test_a_dead_hosts_layers_stay_leased_until_its_guardian_unmounted_them(image: str, cache: ImageCache) -> None:
    """The host dies; its guardian has not cleaned up yet (stopped here): the image and the
    snapshot may still be mounted (in a namespace an exec still holds), so neither may go.
    Once it has cleaned up, both can."""
    with host_process(image) as (host, facts):
        os.kill(facts["guardian"], signal.SIGSTOP)  # by pid: the guardian of the host we started
        host.send_signal(signal.SIGKILL)
        host.wait()
        # The sandbox's mounts are in its own namespace, not the host's (mount_ns.py):
        assert mounts_under(facts["root"]) == [] and os.path.exists(facts["root"])  # nothing cleaned up yet
        assert ImageCache(cache.root, max_bytes=1).evict() == []  # so the image is still leased
        assert entries(cache) == [facts["snapshot"]]
        os.kill(facts["guardian"], signal.SIGCONT)
        wait_exit(facts["guardian"], timeout=10)
        assert mounts_under(facts["root"]) == [] and not os.path.exists(facts["root"])
        assert ImageCache(cache.root, max_bytes=1).evict() != []
        assert entries(cache) == []  # its owner and its users are gone: removed by the guardian


def test_a_snapshot_outlives_its_dead_owner_while_another_host_runs_on_it(image: str, cache: ImageCache) -> None:
    async def main() -> None:
        with host_process(image) as (host, facts):
            local = RuntimeHost(kind="sandbox")
            try:
                await local.create_started("sibling", owner="y", image=image)
                info = await local.claim_setup("sibling", "setup-key")
                assert info.snapshot == facts["snapshot"]
                host.send_signal(signal.SIGKILL)
                host.wait()
                wait_exit(facts["guardian"], timeout=10)
                assert entries(cache) == [facts["snapshot"]]  # still in use here
                assert (await local.exec("sibling", ["cat", "/state"])).stdout == "frozen\n"
                await local.stop("sibling")
                assert entries(cache) == []  # its last user let it go: removed
            finally:
                await local.shutdown()

    asyncio.run(main())


def test_a_snapshot_whose_owner_let_go_is_never_started_from_again(image: str, cache: ImageCache) -> None:
    """The owner lets go (the schedule moved on) while a sandbox still runs on it: that one
    keeps it; a new claim runs the setup anew rather than start from an orphan."""

    async def main() -> None:
        local = RuntimeHost(kind="sandbox")
        try:
            for name in ("builder", "user", "late"):
                await local.create_started(name, owner="y", image=image)
            await local.claim_setup("builder", "k")
            first = await local.freeze_setup("builder")
            assert (await local.claim_setup("user", "k")).snapshot == first
            assert image_cache.default_image_cache().snapshots.let_go() == [first]
            assert entries(cache) == [first]  # "user" runs on it
            assert (await local.claim_setup("late", "k")).snapshot is None  # build it again
            second = await local.freeze_setup("late")
            assert second != first and sorted(entries(cache)) == sorted([first, second])
            await local.stop("user")
            assert entries(cache) == [second]
        finally:
            await local.shutdown()
        assert entries(cache) == []

    asyncio.run(main())
