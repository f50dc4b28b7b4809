"""Issue 32 §2 (what was left): a Podman container's root is no host user, a task's memory and
CPU budget holds its programs, and no image tag of ours is left in the store after a run —
against real Podman containers; skipped, with the reason, where Podman cannot run one."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from image_rig import python_image
from test_podman import _needs_podman, run  # noqa: F401 - the autouse fixture skips without podman

from rollout_ray import ProgramResult, TaskResources
from rollout_ray._runtimes.host import RuntimeHost
from rollout_ray._runtimes.podman import PodmanRuntime
from rollout_ray._runtimes.podman_images import tag_of
from rollout_ray._runtimes.podman_limits import USERNS_BASE

pytestmark = pytest.mark.security

HOG = "import sys; chunks = [bytearray(16 << 20) for _ in range(int(sys.argv[1]))]; print('held', len(chunks))"
"""Holds argv[1] x 16 MiB, touched (bytearray zero-fills every page)."""


def status_uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Uid:")).split()[1])


def test_the_containers_root_is_no_host_user(tmp_path: Path) -> None:
    """Before, the container's root was the host's root (no user namespace): a process
    escaping its mount namespace would have acted as root on the host."""
    if os.geteuid() != 0:
        pytest.skip(
            "rootless: Podman maps the container's root onto the invoking user and, without a subuid "
            "range, can map nothing else (docs/runtime-providers.md)"
        )

    async def main() -> tuple[str, int, str]:
        rt = PodmanRuntime(root=str(tmp_path), image=python_image())
        await rt.start()
        try:
            inside = await rt.exec(["sh", "-c", "id -u; cat /proc/self/uid_map"])
            written = await rt.exec(["sh", "-c", "echo x > /tmp/mine && stat -c %u /tmp/mine"])
            assert rt._init_pid is not None
            return inside.stdout, status_uid(rt._init_pid), written.stdout
        finally:
            await rt.stop()

    inside, host_uid, owner = run(main())
    uid, mapping = inside.split("\n", 1)
    assert uid == "0" and owner == "0\n"  # root inside, owning what it writes ...
    assert mapping.split() == ["0", str(USERNS_BASE), "65536"]
    assert host_uid == USERNS_BASE  # ... and, seen from the host, a uid no host user has
    assert host_uid not in {0, os.getuid()}


def test_a_program_over_the_tasks_memory_budget_is_stopped_and_one_within_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, every container had 8 GiB and every core whatever its task asked. And the
    caller's directory stays clean: conmon writes an ``oom`` file in its cwd on an OOM kill
    (it did in the checkout's), so podman runs from the host's directory."""
    caller = tmp_path / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)

    async def main() -> tuple[ProgramResult, ProgramResult, str]:
        (tmp_path / "host").mkdir()
        rt = PodmanRuntime(
            root=str(tmp_path / "host"), image=python_image(), budget=TaskResources(memory=0.128, cpu=0.5)
        )
        await rt.start()
        try:
            within = await rt.exec(["python3", "-c", HOG, "2"], timeout=120)
            over = await rt.exec(["python3", "-c", HOG, "24"], timeout=120)  # 384 MiB > 128 MB
            quota = await rt.exec(
                ["sh", "-c", "cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null"]
            )
            return within, over, quota.stdout
        finally:
            await rt.stop()

    within, over, quota = run(main())
    assert (within.exit_code, within.stdout) == (0, "held 2\n"), within.stderr
    assert over.exit_code == 137 and "held" not in over.stdout, over  # SIGKILLed by the OOM killer
    assert quota.split()[0] == "50000", quota  # half of each 100 ms period: --cpus 0.5
    assert list(caller.iterdir()) == []


def exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image], capture_output=True, timeout=60).returncode == 0


def test_no_image_tag_of_ours_is_left_after_a_run(tmp_path: Path) -> None:
    """Before, every archive's tag (``localhost/rollout-ray/KEY``) and the image its load made
    stayed in the store for good. Now the host that used it removes both at its shutdown —
    not while another host of the process still holds the tag."""
    archive = tmp_path / "image.tar"  # a path of its own: a tag no other test shares
    shutil.copyfile(python_image(), archive)
    tag = tag_of(str(archive))

    async def main() -> list[Any]:
        (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
        first, second = RuntimeHost(str(tmp_path / "a"), kind="podman"), RuntimeHost(str(tmp_path / "b"), kind="podman")
        try:
            await first.create_started("r", image=str(archive))
            await second.create_started("r", image=str(archive))
            loaded = subprocess.run(
                ["podman", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True, timeout=60
            ).stdout.strip()
        finally:
            await first.shutdown()
        try:
            return [loaded, exists(tag)]
        finally:
            await second.shutdown()

    image_id, held = run(main())
    assert image_id and held  # the second host still held it
    assert not exists(tag) and not exists(image_id)  # gone with the last host: the tag and the image
