"""Issue 23 §2: sandboxes before they are asked for — a host's warm pool per image, filled from
the schedule ahead and the measured start time, health-checked at hand-out, trimmed when the
schedule moves on; and the caps on sandbox starts, per node and per cluster."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from image_rig import busybox_rootfs, needs_image, rootfs_tarball

from rollout_ray._runtimes import image_cache
from rollout_ray._runtimes.guardian import mounts_under
from rollout_ray._runtimes.host import POOL_OWNER, RuntimeHost
from rollout_ray._runtimes.start_gate import NodeStartGate, StartLimits, admitted
from rollout_ray._runtimes.warm_pool import ImageStats, WarmPool


@pytest.fixture
def image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A busybox image, in a private cache the hosts of this process use."""
    monkeypatch.setenv("ROLLOUT_RAY_IMAGE_CACHE", str(tmp_path / "cache"))
    image_cache.default_image_cache.cache_clear()
    yield str(rootfs_tarball(busybox_rootfs(), tmp_path / "busybox.tar.gz"))
    image_cache.default_image_cache.cache_clear()


def members(host: RuntimeHost) -> list[str]:
    return [n for n in host.names() if host.owner(n) == POOL_OWNER]


@needs_image
def test_a_prepared_host_hands_out_started_sandboxes_and_refills(image: str, tmp_path: Path) -> None:
    async def main() -> None:
        host = RuntimeHost(kind="sandbox")
        try:
            await host.prepare({image: 2})
            await host.pool.settled()
            warm = {host._runtimes[n].id for n in members(host)}
            assert len(warm) == 2
            t0 = time.perf_counter()
            info = await host.create_started("rollout-1", owner="r1", image=image)
            took = time.perf_counter() - t0
            assert host.owner("rollout-1") == "r1" and info.name == "rollout-1"
            assert info.image is not None and info.id in warm  # one of the members, renamed
            assert (await host.exec("rollout-1", ["sh", "-c", "echo in a warm box"])).stdout == "in a warm box\n"
            await host.pool.settled()
            assert len(members(host)) == 2  # refilled
            stats = host.statistics()["pool"][image]
            assert (stats["hits"], stats["misses"], stats["idle"]) == (1, 0, 2) and stats["start_seconds"] > took
        finally:
            await host.shutdown()
        assert not os.path.exists(host.root)

    asyncio.run(main())


@needs_image
def test_the_pool_is_trimmed_when_the_schedule_moves_on(image: str, tmp_path: Path) -> None:
    async def main() -> None:
        host = RuntimeHost(kind="sandbox")
        try:
            await host.prepare({image: 3})
            await host.pool.settled()
            assert len(members(host)) == 3
            await host.prepare({image: 1})
            assert len(members(host)) == 1
            await host.prepare({})
            assert members(host) == [] and mounts_under(host.root) == []
        finally:
            await host.shutdown()

    asyncio.run(main())


@needs_image
def test_a_member_that_is_no_longer_intact_is_never_handed_out(image: str, tmp_path: Path) -> None:
    async def main() -> None:
        host = RuntimeHost(kind="sandbox")
        try:
            await host.prepare({image: 1})
            await host.pool.settled()
            [name] = members(host)
            broken = host._runtimes[name]
            # Something undid one of its mounts (in the sandbox's own mount namespace):
            subprocess.run(
                [*broken._ns.enter_args(), "umount", "-l", os.path.join(broken.id, "root", ".rollout-ray")], check=True
            )
            await host.create_started("rollout-1", owner="r1", image=image)
            assert host._runtimes["rollout-1"] is not broken and broken.stopped
            assert (await host.exec("rollout-1", ["true"])).exit_code == 0
        finally:
            await host.shutdown()

    asyncio.run(main())


def test_the_pool_size_follows_what_is_coming_and_the_measured_start_time() -> None:
    """Everything coming while nothing is measured; then what is taken while two start."""

    async def never(_: Any) -> Any:
        raise AssertionError("not started in this test")

    async def main() -> None:
        pool = WarmPool(never, never, max_idle=64)
        pool.wanted = {"img": 40}
        assert pool.target("img") == 40
        pool.stats["img"] = ImageStats(start_seconds=0.004, take_interval=0.1)  # fast starts, slow takes
        assert pool.target("img") == 1
        pool.stats["img"] = ImageStats(start_seconds=3.0, take_interval=0.25)  # slow starts
        assert pool.target("img") == 24
        pool.stats["img"] = ImageStats(start_seconds=30.0, take_interval=0.25)
        assert pool.target("img") == 40  # never more than are coming
        pool.wanted = {}
        assert pool.target("img") == 0

    asyncio.run(main())


# -- caps on starts -------------------------------------------------------------------------------


def test_the_node_gate_caps_starts_at_once_across_processes(tmp_path: Path) -> None:
    """Two gates on one directory stand for two processes of a node (each lock is its own open
    file): never more than ``concurrency`` starts inside at once between them."""
    gates = [NodeStartGate(str(tmp_path), StartLimits(concurrency=2)) for _ in range(2)]
    inside, most = 0, 0

    async def start(gate: NodeStartGate) -> None:
        nonlocal inside, most
        async with admitted([gate]):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.01)
            inside -= 1

    async def main() -> None:
        await asyncio.gather(*(start(gates[i % 2]) for i in range(12)))

    asyncio.run(main())
    assert most == 2


def test_the_node_gate_caps_starts_a_second(tmp_path: Path) -> None:
    gate = NodeStartGate(str(tmp_path), StartLimits(per_second=4))

    async def main() -> float:
        t0 = time.monotonic()
        for _ in range(8):  # a full bucket lets 4 through at once, then one every 0.25 s
            async with gate.admit():
                pass
        return time.monotonic() - t0

    assert asyncio.run(main()) >= 0.9


def test_start_limits_name_a_bad_value() -> None:
    with pytest.raises(ValueError, match=r"^`concurrency` of sandbox starts must be >= 1 or None, got 0$"):
        StartLimits(concurrency=0)
    with pytest.raises(ValueError, match=r"^`per_second` of sandbox starts must be > 0 or None, got -1$"):
        StartLimits(per_second=-1)
