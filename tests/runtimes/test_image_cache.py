"""Issue 23 §1 and §5: the node's image cache — unpacked once across processes, bounded in
bytes, least recently used images evicted first, never one that a runtime or process holds."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from image_rig import busybox_rootfs, docker_archive, member, needs_image, tar_bytes

from rollout_ray import SandboxRuntime
from rollout_ray._errors import SandboxError
from rollout_ray._runtimes.image import locate
from rollout_ray._runtimes.image_cache import ImageCache

pytestmark = needs_image

LEASER = """
import json, sys
from rollout_ray._runtimes.image_cache import ImageCache
lease = ImageCache(sys.argv[1]).lease(sys.argv[2])
print(json.dumps({"unpacked": lease.unpacked, "rootfs": lease.rootfs}), flush=True)
sys.stdin.read()  # holds the lease until the test closes our stdin, or kills us
"""


def image(tmp_path: Path, name: str) -> str:
    """A busybox rootfs tarball of its own (a marker file makes its digest differ)."""
    path = tmp_path / f"{name}.tar"
    path.write_bytes(tar_bytes(busybox_rootfs(), [member("marker", name.encode())]))
    return str(path)


def leaser(cache: ImageCache, spec: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", LEASER, cache.root, spec], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def holds_open(pid: int, path: str) -> bool:
    fds = f"/proc/{pid}/fd"
    try:
        return any(os.readlink(os.path.join(fds, fd)) == path for fd in os.listdir(fds))
    except OSError:
        return False


def entries(cache: ImageCache) -> set[str]:
    return set(os.listdir(os.path.join(cache.root, "v1", "images")))


def test_two_processes_needing_one_image_unpack_it_once(tmp_path: Path) -> None:
    cache = ImageCache(str(tmp_path / "cache"))
    spec = image(tmp_path, "shared")
    key = locate(spec).key.removeprefix("sha256:")
    lock = os.path.join(cache._dir("locks"), f"{key}.lock")
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # as a third process unpacking it would
    procs = [leaser(cache, spec) for _ in range(2)]
    try:
        deadline = time.monotonic() + 30
        while not all(holds_open(p.pid, lock) for p in procs):  # both are waiting for the lock
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.01)
        assert all(p.poll() is None for p in procs) and entries(cache) == set()
        os.close(held)  # "the third process died without finishing": one of the two unpacks it
        results = [json.loads(p.stdout.readline()) for p in procs]  # type: ignore[union-attr]
        assert sorted(r["unpacked"] for r in results) == [False, True]
        assert results[0]["rootfs"] == results[1]["rootfs"] and os.path.isdir(results[0]["rootfs"])
        assert entries(cache) == {key} and os.listdir(os.path.join(cache.root, "v1", "build")) == []
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdin.close()  # type: ignore[union-attr]
            p.stdout.close()  # type: ignore[union-attr]


def test_a_build_a_dead_process_left_is_removed(tmp_path: Path) -> None:
    cache = ImageCache(str(tmp_path / "cache"))
    spec = image(tmp_path, "a")
    key = locate(spec).key.removeprefix("sha256:")
    stale = Path(cache._dir("build")) / f"{key}-dead1234" / "rootfs"
    stale.mkdir(parents=True)
    (stale / "half-written").write_text("x")
    lease = cache.lease(spec)
    lease.release()
    assert lease.unpacked and os.listdir(cache._dir("build")) == []


def test_eviction_is_least_recently_used_within_the_bound_and_spares_leased_images(tmp_path: Path) -> None:
    specs = {name: image(tmp_path, name) for name in "abc"}
    keys = {name: locate(spec).key.removeprefix("sha256:") for name, spec in specs.items()}
    probe = ImageCache(str(tmp_path / "probe"))
    size = probe.lease(specs["a"]).bytes
    cache = ImageCache(str(tmp_path / "cache"), max_bytes=size * 3 // 2)  # room for one image and a half

    a = cache.lease(specs["a"])  # held throughout the first rounds
    cache.lease(specs["b"]).release()
    assert entries(cache) == {keys["a"], keys["b"]}  # over the bound: but a is held, b just made
    c = cache.lease(specs["c"])
    assert entries(cache) == {keys["a"], keys["c"]}  # b: the only image unused
    stats = cache.statistics()
    assert (stats.images, stats.in_use, stats.bytes) == (2, 2, 2 * size)
    a.release()
    c.release()
    b = cache.lease(specs["b"])  # unpacked again; a (leased before c) goes first, then c
    assert b.unpacked and entries(cache) == {keys["b"]}
    assert os.listdir(os.path.join(cache.root, "v1", "trash")) == []
    b.release()


def test_a_lease_held_by_another_process_pins_its_image_until_that_process_dies(tmp_path: Path) -> None:
    cache = ImageCache(str(tmp_path / "cache"), max_bytes=1)
    spec = image(tmp_path, "pinned")
    key = locate(spec).key.removeprefix("sha256:")
    proc = leaser(cache, spec)
    try:
        assert json.loads(proc.stdout.readline())["unpacked"]  # type: ignore[union-attr]
        assert cache.evict() == [] and entries(cache) == {key}
        assert cache.statistics().in_use == 1
        proc.send_signal(signal.SIGKILL)  # the kernel drops its lock: nothing to clean up after it
        proc.wait()
        assert cache.evict() == [f"sha256:{key}"] and entries(cache) == set()
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()  # type: ignore[union-attr]
        proc.stdout.close()  # type: ignore[union-attr]


def test_a_sandbox_holds_its_image_until_it_stops(tmp_path: Path) -> None:
    cache = ImageCache(str(tmp_path / "cache"))
    evicting = ImageCache(cache.root, max_bytes=1)  # another process's view, bounded to nothing
    spec = image(tmp_path, "in-use")
    key = locate(spec).key.removeprefix("sha256:")

    async def main() -> None:
        rt = SandboxRuntime(root=str(tmp_path), image=spec, image_cache=cache)
        await rt.start()
        try:
            assert evicting.evict() == [] and entries(cache) == {key}
            assert (await rt.exec(["cat", "/marker"])).stdout == "in-use"
        finally:
            await rt.stop()
        assert evicting.evict() == [f"sha256:{key}"]

    asyncio.run(main())


FAKE_ENGINE = """#!/bin/sh
# A container engine's command line, over one image saved beforehand: {archive}
case "$1 $2" in
  "image inspect") [ "$5" = app:1 ] && echo {image_id} && exit 0; echo "Error: No such image: $5" >&2; exit 1;;
  "save -o") echo save >> {log}; cp {archive} "$3"; exit 0;;
esac
exit 2
"""


def test_an_image_name_is_looked_up_in_a_container_engines_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = docker_archive([tar_bytes(busybox_rootfs())], tmp_path / "saved.tar", {"Env": ["FROM=engine"]})
    image_id = locate(str(archive)).key  # docker's image ID is its config's digest
    engines = tmp_path / "bin"
    engines.mkdir()
    log = tmp_path / "saves.log"
    (engines / "docker").write_text(FAKE_ENGINE.format(archive=archive, image_id=image_id, log=log))
    (engines / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{engines}:/usr/bin:/bin")
    cache = ImageCache(str(tmp_path / "cache"))

    async def main() -> str:
        rt = SandboxRuntime(root=str(tmp_path), image="app:1", image_cache=cache)
        await rt.start()
        try:
            return (await rt.exec(["sh", "-c", "echo $FROM"])).stdout
        finally:
            await rt.stop()

    assert asyncio.run(main()) == "engine\n"
    lease = cache.lease("app:1")  # found by its ID: not exported again
    lease.release()
    assert (lease.unpacked, log.read_text(), lease.key) == (False, "save\n", image_id)
    with pytest.raises(
        SandboxError,
        match=r"^image 'other:2' is no file or directory, and no container engine could "
        r"look it up by name: (podman: .*; )?docker: Error: No such image: other:2$",
    ):  # podman: where installed
        cache.lease("other:2")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(
        SandboxError,
        match=r"^image 'app:1' is no file or directory, and no container engine "
        r"\(podman, docker\) is installed to look it up by name; give the path of "
        r"an exported image \(docker save\)$",
    ):
        cache.lease("app:1")


def test_docker_without_its_daemon_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's case: the docker client is installed, no engine runs."""
    docker = subprocess.run(["sh", "-c", "command -v docker"], capture_output=True, text=True).stdout.strip()
    if not docker or subprocess.run([docker, "info"], capture_output=True, timeout=60).returncode == 0:
        pytest.skip("needs a docker client without a running daemon")
    monkeypatch.setenv("PATH", os.path.dirname(docker))
    with pytest.raises(
        SandboxError,
        match=r"^image 'busybox:latest' is no file or directory, and no container engine "
        r"could look it up by name: docker: .*daemon",
    ):
        ImageCache(str(tmp_path / "cache")).lease("busybox:latest")
