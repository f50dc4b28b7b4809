"""Issue 32 §3 (and §1's last sentence): the red team's probes against the image cache.

Small images made here with ``tarfile`` (no engine, no sandbox): an archive of inodes under a
byte bound, a ``docker save`` archive claiming another image's key, links planted in the
cache's own directories, whiteouts naming ``.`` or ``..``, and setup snapshots that take disk
beside the images.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from image_rig import docker_archive, member, oci_blobs, oci_layout, sha, tar_bytes

from rollout_ray._errors import SandboxError
from rollout_ray._runtimes.image import locate
from rollout_ray._runtimes.image_cache import ImageCache

DIR, SYM = tarfile.DIRTYPE, tarfile.SYMTYPE


def rootfs(tmp_path: Path, name: str, *entries: tuple[tarfile.TarInfo, bytes | None]) -> str:
    path = tmp_path / f"{name}.tar"
    path.write_bytes(gzip.compress(tar_bytes(None, entries), mtime=0))
    return str(path)


def test_an_archive_of_inodes_counts_their_metadata_toward_the_byte_bound(tmp_path: Path) -> None:
    # No file content at all: directories, links with long targets and empty files.
    entries = [member(f"d{i}", kind=DIR, mode=0o755) for i in range(600)]
    entries += [member(f"l{i}", kind=SYM, link="x" * 4000) for i in range(150)]
    entries += [member(f"d{i}/f", b"") for i in range(600)]
    image = rootfs(tmp_path, "inodes", *entries)
    assert os.path.getsize(image) < 1 << 20
    cache = ImageCache(str(tmp_path / "cache"), max_bytes=1 << 20)
    with pytest.raises(SandboxError, match=r"^image '.*inodes.tar' unpacks to more than 1048576 bytes"):
        cache.lease(image)
    assert os.listdir(tmp_path / "cache" / "v1" / "build") == []


def test_an_archive_of_more_inodes_than_the_bound_is_refused(tmp_path: Path) -> None:
    image = rootfs(tmp_path, "files", *[member(f"f{i}", b"") for i in range(300)])
    cache = ImageCache(str(tmp_path / "cache"), max_inodes=200)
    with pytest.raises(
        SandboxError,
        match=r"^image '.*files.tar' unpacks to more than 200 files and directories, "
        r"the image cache's bound; raise it \(ROLLOUT_RAY_IMAGE_CACHE_INODES\)",
    ):
        cache.lease(image)
    roomy = ImageCache(str(tmp_path / "cache"), max_inodes=400)
    lease = roomy.lease(image)
    assert len(os.listdir(lease.rootfs)) == 300
    info = json.loads((Path(lease.rootfs).parent / "image.json").read_text())
    assert info["inodes"] >= 300 and info["bytes"] >= 300 * 4096  # metadata counted, as on disk
    lease.release()


def _docker_archive_with_config(config: bytes, dest: Path) -> Path:
    name = hashlib.sha256(config).hexdigest() + ".json"
    with tarfile.open(dest, "w") as tar:
        for member_name, data in (
            (name, config),
            ("manifest.json", json.dumps([{"Config": name, "Layers": []}]).encode()),
        ):
            info = tarfile.TarInfo(member_name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dest


def test_a_docker_archive_cannot_file_its_tree_under_another_images_key(tmp_path: Path) -> None:
    layer = tar_bytes(None, [member("marker", b"image A")])
    a = oci_layout([layer], tmp_path / "a")
    blobs, index = oci_blobs([layer])
    manifest = blobs["blobs/sha256/" + index["manifests"][0]["digest"].removeprefix("sha256:")]
    forged = _docker_archive_with_config(manifest, tmp_path / "forged.tar")
    config = next(data for data in blobs.values() if data.startswith(b'{"architecture"'))
    assert locate(str(a)).key == sha(config)  # an image is named by its config, whatever its format
    cache = ImageCache(str(tmp_path / "cache"))
    with pytest.raises(
        SandboxError,
        match=r"^image '.*forged.tar': its config .* is no image config \(no "
        r"rootfs.diff_ids\); refusing it$",
    ):
        cache.lease(str(forged))
    lease = cache.lease(str(a))
    assert (Path(lease.rootfs) / "marker").read_bytes() == b"image A"
    lease.release()


def test_a_planted_trash_link_is_not_followed_by_eviction(tmp_path: Path) -> None:
    ImageCache(str(tmp_path / "cache")).lease(rootfs(tmp_path, "one", member("marker", b"1"))).release()
    cache = ImageCache(str(tmp_path / "cache"), max_bytes=1)  # evicts all it may
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("precious")
    trash = tmp_path / "cache" / "v1" / "trash"
    trash.rmdir()
    trash.symlink_to(victim)
    with pytest.raises(
        SandboxError,
        match=r"^image cache directory '.*/v1/trash' is a symbolic link or not a "
        r"directory of this user's; remove it",
    ):
        cache.evict()
    assert (victim / "precious").read_text() == "precious"


def test_a_planted_image_entry_link_is_not_used_as_that_image(tmp_path: Path) -> None:
    cache = ImageCache(str(tmp_path / "cache"))
    other = cache.lease(rootfs(tmp_path, "other", member("marker", b"other")))
    other.release()
    wanted = rootfs(tmp_path, "wanted", member("marker", b"wanted"))
    entry = tmp_path / "cache" / "v1" / "images" / locate(wanted).key.removeprefix("sha256:")
    entry.symlink_to(Path(other.rootfs).parent)
    lease = cache.lease(wanted)
    assert (Path(lease.rootfs) / "marker").read_bytes() == b"wanted"
    assert not entry.is_symlink() and (Path(other.rootfs) / "marker").read_bytes() == b"other"
    lease.release()


@pytest.mark.parametrize("name", [".wh.", ".wh..", ".wh...", "sub/.wh..", "sub/.wh..."])
def test_a_whiteout_naming_no_file_is_refused_in_one_line(name: str, tmp_path: Path) -> None:
    base = tar_bytes(None, [member("sub", kind=DIR, mode=0o755), member("sub/kept", b"kept"), member("top", b"t")])
    image = oci_layout([base, tar_bytes(None, [member(name, b"")])], tmp_path / "image")
    cache = ImageCache(str(tmp_path / "cache"))
    with pytest.raises(SandboxError, match=r"^image '.*': whiteout '.*' names no file; refusing the image$"):
        cache.lease(str(image))


def test_setup_snapshots_count_toward_the_cache_bound(tmp_path: Path) -> None:
    big = b"\xa5" * (256 << 10)
    one = rootfs(tmp_path, "one", member("blob", big + b"1"))
    two = rootfs(tmp_path, "two", member("blob", big + b"2"))
    probe = ImageCache(str(tmp_path / "probe"))
    size = probe.lease(one).bytes
    cache = ImageCache(str(tmp_path / "cache"), max_bytes=size * 5 // 2)  # two images, not three
    cache.lease(one).release()
    upper = tmp_path / "upper"
    upper.mkdir()
    (upper / "built").write_bytes(big)
    outcome, build = asyncio.run(cache.snapshots.claim("ab" * 16, None, lambda: False))
    assert outcome == "build"
    cache.snapshots.freeze(build, str(upper), {"setup": "s", "image": "i"}, None)
    assert cache.statistics().snapshot_bytes >= len(big)
    cache.lease(two).release()
    assert [e.removeprefix("sha256:") for e in [locate(two).key]] == os.listdir(
        tmp_path / "cache" / "v1" / "images"
    )  # one was evicted: the snapshot takes its room
    cache.snapshots.let_go()


def test_an_engine_export_that_does_not_prove_its_id_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine (or whatever answers as one on PATH) naming image A's ID but exporting
    another image files nothing under A's key."""
    from test_image_cache import FAKE_ENGINE

    trusted = rootfs(tmp_path, "trusted", member("marker", b"trusted"))
    other = docker_archive([tar_bytes(None, [member("marker", b"other")])], tmp_path / "other.tar")
    engines = tmp_path / "bin"
    engines.mkdir()
    (engines / "docker").write_text(
        FAKE_ENGINE.format(archive=other, image_id=locate(trusted).key, log=tmp_path / "log")
    )
    (engines / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{engines}:/usr/bin:/bin")
    cache = ImageCache(str(tmp_path / "cache"))
    with pytest.raises(
        SandboxError,
        match=r"^image 'app:1' is named sha256:\w+ but its content proves None; "
        r"refusing it",
    ):
        cache.lease("app:1")
    lease = cache.lease(trusted)
    assert (Path(lease.rootfs) / "marker").read_bytes() == b"trusted"
    lease.release()
