"""Issue 23 §1: a task's image — its formats, unpacked once per node, checked and contained.

Busybox images built at test time (``image_rig``) in each format a task may give: a rootfs
tarball, an OCI layout of two layers with whiteouts (as a directory, and as the tar Docker 25
saves), a classic ``docker save`` archive. Each unpacks to the tree its layers describe and
runs in a sandbox; a damaged layer, a name climbing out, a link steering a write out or a
hard link to a host file refuse the image or stay inside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest
from image_rig import (
    busybox_rootfs,
    docker_archive,
    member,
    needs_image,
    oci_archive,
    oci_layout,
    rootfs_tarball,
    tar_bytes,
)

from rollout_ray import SandboxRuntime
from rollout_ray._errors import SandboxError
from rollout_ray._runtimes.image_cache import ImageCache

pytestmark = needs_image

CONFIG = {"Env": ["PATH=/bin:/opt/tools", "GREETING=from the image"], "WorkingDir": "/srv/app"}
DIR = tarfile.DIRTYPE


def layers() -> list[bytes]:
    """Busybox, then a layer that deletes a file (``.wh.``), empties a directory of the first
    layer's entries (``.wh..wh..opq``) but keeps its own, and adds a tool and the work dir."""
    base = tar_bytes(
        busybox_rootfs(),
        [
            member("etc/removed.txt", b"gone in layer 2"),
            member("etc/kept.txt", b"kept"),
            member("opt/cache", kind=DIR, mode=0o755),
            member("opt/cache/old-1", b"1"),
            member("opt/cache/old-2", b"2"),
        ],
    )
    top = tar_bytes(
        None,
        [
            member("opt/cache", kind=DIR, mode=0o755),
            member("opt/cache/new", b"new"),
            member("opt/cache/.wh..wh..opq"),
            member("etc/.wh.removed.txt"),
            member("opt/tools", kind=DIR, mode=0o755),
            member("opt/tools/hello", b"#!/bin/sh\necho hello from layer 2\n", mode=0o755),
            member("srv/app", kind=DIR, mode=0o755),
            member("srv/app/README", b"the image's work dir"),
        ],
    )
    return [base, top]


FORMATS = {
    "oci-layout": lambda dest: oci_layout(layers(), dest / "oci", CONFIG),
    "oci-archive": lambda dest: oci_archive(layers(), dest / "oci.tar", CONFIG),
    "docker-archive": lambda dest: docker_archive(layers(), dest / "docker.tar", CONFIG),
}


def build(kind: str, dest: Path) -> str:
    if kind == "rootfs":
        return str(rootfs_tarball(busybox_rootfs(), dest / "rootfs.tar.gz"))
    (dest / "oci").mkdir()
    return str(FORMATS[kind](dest))


def run(main: Any) -> Any:
    return asyncio.run(main())


def tree(root: str) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files}


@pytest.mark.parametrize("kind", ["rootfs", *FORMATS])
def test_each_format_unpacks_to_its_layers_and_runs(kind: str, tmp_path: Path) -> None:
    cache = ImageCache(str(tmp_path / "cache"))
    image = build(kind, tmp_path)
    lease = cache.lease(image)
    try:
        rootfs = Path(lease.rootfs)
        assert (rootfs / "bin" / "busybox").is_file() and os.readlink(rootfs / "bin" / "sh") == "busybox"
        if kind != "rootfs":
            assert not (rootfs / "etc" / "removed.txt").exists() and (rootfs / "etc" / "kept.txt").read_text() == "kept"
            assert sorted(os.listdir(rootfs / "opt" / "cache")) == ["new"]  # opaque: the lower entries gone
            assert (lease.config.env, lease.config.working_dir) == (tuple(CONFIG["Env"]), "/srv/app")
        assert lease.unpacked
    finally:
        lease.release()

    async def main() -> str:
        rt = SandboxRuntime(root=str(tmp_path), image=image, image_cache=cache)
        await rt.start()
        try:
            r = await rt.exec(
                [
                    "sh",
                    "-c",
                    "pwd; echo $GREETING; ls /; test -e /usr/bin/python3 || echo no host usr;"
                    " hello 2>/dev/null; cat README 2>/dev/null; true",
                ]
            )
            assert r.exit_code == 0, r.stderr
            return r.stdout
        finally:
            await rt.stop()

    out = run(main).splitlines()
    if kind == "rootfs":  # no config: /work, the standard PATH
        assert out[:2] == ["/work", ""] and "no host usr" in out
        assert set(out[2:-1]) == {"bin", "dev", "etc", "proc", "tmp", "usr", "work"}  # usr: the docs
    else:
        assert out[:2] == ["/srv/app", "from the image"]
        assert out[-2:] == ["hello from layer 2", "the image's work dir"]
        assert {"bin", "etc", "opt", "srv", "dev", "proc", "tmp"} <= set(out[2:])
    again = cache.lease(image)  # unpacked once: the next lease finds it
    assert not again.unpacked and again.rootfs == lease.rootfs
    again.release()


def test_a_layer_that_does_not_match_its_digest_refuses_the_image(tmp_path: Path) -> None:
    cache = ImageCache(str(tmp_path / "cache"))
    (tmp_path / "oci").mkdir()
    layout = oci_layout(layers(), tmp_path / "oci", CONFIG)
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads((layout / "blobs" / "sha256" / index["manifests"][0]["digest"][7:]).read_bytes())
    blob = layout / "blobs" / "sha256" / manifest["layers"][1]["digest"][7:]
    data = bytearray(blob.read_bytes())
    data[-9] ^= 0xFF  # inside the gzip trailer: the blob's digest changes, maybe its content too
    blob.write_bytes(bytes(data))
    with pytest.raises(SandboxError, match=r"^image '.*/oci': layer 2 of 2(:| is not a readable tar layer)"):
        cache.lease(str(layout))
    assert os.listdir(tmp_path / "cache" / "v1" / "images") == []
    assert os.listdir(tmp_path / "cache" / "v1" / "build") == []

    # An uncompressed layer whose content changed but not its config: the diff_id catches it.
    archive = docker_archive(layers(), tmp_path / "docker.tar", CONFIG)
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    name = json.loads(files["manifest.json"])[0]["Layers"][1]
    files[name] = tar_bytes(None, [member("etc/planted", b"not in the image")])
    tampered = tmp_path / "tampered.tar"
    with tarfile.open(tampered, "w") as tar:
        for member_name, data in files.items():
            info = tarfile.TarInfo(member_name)
            info.size = len(data)
            tar.addfile(info, __import__("io").BytesIO(data))
    with pytest.raises(
        SandboxError,
        match=r"^image '.*tampered.tar': layer 2 of 2: its diff_id is sha256:[0-9a-f]{64} "
        r"but the image says sha256:[0-9a-f]{64}: the archive is damaged or was "
        r"altered; refusing it$",
    ):
        cache.lease(str(tampered))


def hostile(tmp_path: Path, *entries: tuple[tarfile.TarInfo, bytes | None]) -> str:
    return str(rootfs_tarball_from(tar_bytes(busybox_rootfs(), entries), tmp_path / f"hostile-{len(entries)}.tar"))


def rootfs_tarball_from(data: bytes, dest: Path) -> Path:
    dest.write_bytes(data)
    return dest


def test_nothing_in_a_layer_reaches_outside_the_tree(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("precious")
    climb = "../" * 30 + str(outside).lstrip("/")
    image = hostile(
        tmp_path,
        member("/abs/file", b"absolute names land inside"),
        member("out", kind=tarfile.SYMTYPE, link=str(outside)),  # an absolute link to a host dir
        member("out/pwned", b"written through a link?"),
        member("up", kind=tarfile.SYMTYPE, link=climb),  # a relative link climbing out
        member("up/pwned-too", b"written through a climbing link?"),
        member("precious", kind=tarfile.SYMTYPE, link=str(outside / "precious")),
        member("precious", b"replaces the link, never writes through it"),
        member("suid", b"#!/bin/sh\n", mode=0o6755),
        member("dev/sda", None, kind=tarfile.BLKTYPE),
        member("dev/null", None, kind=tarfile.CHRTYPE),
        member("fifo", None, kind=tarfile.FIFOTYPE),
        member("hard", kind=tarfile.LNKTYPE, link="abs/file"),
    )
    cache = ImageCache(str(tmp_path / "cache"))
    lease = cache.lease(image)
    lease.release()
    rootfs = Path(lease.rootfs)
    assert sorted(os.listdir(outside)) == ["precious"] and (outside / "precious").read_text() == "precious"
    assert (rootfs / "abs" / "file").read_text() == "absolute names land inside"
    assert (rootfs / str(outside).lstrip("/") / "pwned").read_text() == "written through a link?"
    assert (rootfs / str(outside).lstrip("/") / "pwned").parent.parent != outside.parent  # inside the tree
    assert os.readlink(rootfs / "out") == str(outside)  # kept as a link, for the sandbox to resolve inside
    assert not (rootfs / "precious").is_symlink() and (rootfs / "precious").read_text().startswith("replaces")
    assert stat.S_IMODE((rootfs / "suid").stat().st_mode) == 0o755
    assert not (rootfs / "dev" / "sda").exists() and not (rootfs / "dev" / "null").exists()
    assert stat.S_ISFIFO((rootfs / "fifo").lstat().st_mode)
    assert (rootfs / "hard").stat().st_ino == (rootfs / "abs" / "file").stat().st_ino


@pytest.mark.parametrize(
    "entry, message",
    [
        (member("../escape", b"x"), r"member '\.\./escape' climbs out of the image; refusing the image$"),
        (member("a/../../escape", b"x"), r"member 'a/\.\./\.\./escape' climbs out of the image; refusing the image$"),
        (
            member("stolen", kind=tarfile.LNKTYPE, link="/etc/shadow"),
            r"hard link 'stolen' -> '/etc/shadow' points at no file of the image; refusing the image$",
        ),
        (
            member("stolen", kind=tarfile.LNKTYPE, link="../../../../etc/shadow"),
            r"hard link 'stolen' -> '\.\./\.\./\.\./\.\./etc/shadow' climbs out of the image; refusing the image$",
        ),
    ],
    ids=["dotdot", "dotdot-inside", "hardlink-absent", "hardlink-climbing"],
)
def test_a_name_or_hard_link_out_of_the_tree_refuses_the_image(entry: Any, message: str, tmp_path: Path) -> None:
    cache = ImageCache(str(tmp_path / "cache"))
    with pytest.raises(SandboxError, match=r"^image '.*': " + message):
        cache.lease(hostile(tmp_path, entry))
    assert os.listdir(tmp_path / "cache" / "v1" / "images") == []
    assert not (tmp_path / "escape").exists() and not (tmp_path.parent / "escape").exists()


def test_a_compression_bomb_is_refused_at_the_cache_bound(tmp_path: Path) -> None:
    image = rootfs_tarball_from(tar_bytes(None, [member("zeros", b"\0" * (8 << 20))]), tmp_path / "bomb.tar")
    cache = ImageCache(str(tmp_path / "cache"), max_bytes=4 << 20)
    with pytest.raises(
        SandboxError,
        match=r"^image '.*bomb.tar' unpacks to more than 4194304 bytes, the image cache's "
        r"bound; raise it \(ROLLOUT_RAY_IMAGE_CACHE_BYTES\) to use this image$",
    ):
        cache.lease(str(image))
    assert os.listdir(tmp_path / "cache" / "v1" / "build") == []


def test_a_directory_that_is_no_oci_layout_and_a_missing_file_are_named(tmp_path: Path) -> None:
    cache = ImageCache(str(tmp_path / "cache"))
    with pytest.raises(SandboxError, match=r"is a directory but no OCI image layout \(no index.json\); pack a root"):
        cache.lease(str(busybox_rootfs()))
    with pytest.raises(SandboxError, match=r"^image '/nonexistent/image.tar': no such file or directory$"):
        cache.lease("/nonexistent/image.tar")
    (tmp_path / "text.tar").write_text("not a tar")
    with pytest.raises(SandboxError, match=r"^image '.*text.tar' is neither a directory nor a tar archive"):
        cache.lease(str(tmp_path / "text.tar"))
