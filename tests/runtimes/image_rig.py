"""Images for the tests, built at test time from Debian's packages, nothing committed.

A root filesystem is ``apt-get download`` + ``dpkg-deb -x`` of a few packages (busybox's
applets linked into ``/bin``), built once and kept under ``ROLLOUT_RAY_TEST_IMAGES``
(default ``~/.cache/rollout-ray-test-images``); a test that cannot build one is skipped with
the reason. The packers write the formats a task may give — a rootfs tarball, an OCI image
layout (directory or tar), a ``docker save`` archive — with ``tarfile``, ``json`` and
``hashlib`` only.

* ``busybox_rootfs()``: busybox-static alone (~2 MB); cheap, for the format tests;
* ``python_rootfs()``: busybox + Debian's minimal Python and its standard library (~45 MB,
  ~4 s to build the first time), for agent programs and the red-team probes.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from rollout_ray import LocalRuntime, SandboxRuntime
from rollout_ray._runtimes.disk import mount_unavailable
from rollout_ray._runtimes.image_cache import ImageCache
from rollout_ray._runtimes.sandbox import sandbox_unavailable

ROOT = Path(os.environ.get("ROLLOUT_RAY_TEST_IMAGES") or Path.home() / ".cache" / "rollout-ray-test-images")
FORMAT = 1
"""Bumped when what a built rootfs holds changes."""


def image_unavailable() -> str | None:
    """Why this machine cannot run image sandboxes or build the test images, or ``None``."""
    missing = [tool for tool in ("apt-get", "apt-cache", "dpkg-deb") if shutil.which(tool) is None]
    if missing:
        return f"cannot build test images without {', '.join(missing)} (a Debian-based machine)"
    return sandbox_unavailable() or mount_unavailable()


IMAGE_REASON = image_unavailable()
needs_image = pytest.mark.skipif(IMAGE_REASON is not None, reason=f"no image sandbox here: {IMAGE_REASON}")


def _run(command: list[str], cwd: Path | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.skip(f"cannot build a test image: {' '.join(command[:3])} failed: {done.stderr.strip()[-300:]}")
    return done.stdout


def _built(name: str, packages: list[str]) -> Path:
    """The rootfs of ``packages``, built once (atomically: concurrent sessions may race)."""
    final = ROOT / f"{name}-v{FORMAT}"
    if (final / "rootfs").is_dir():
        return final / "rootfs"
    ROOT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=ROOT))
    try:
        debs, rootfs = work / "debs", work / "rootfs"
        debs.mkdir()
        rootfs.mkdir(mode=0o755)
        _run(["apt-get", "download", *packages], cwd=debs)
        for deb in sorted(debs.iterdir()):
            _run(["dpkg-deb", "-x", str(deb), str(rootfs)])
        shutil.rmtree(debs)
        busybox = rootfs / "bin" / "busybox"
        for applet in _run([str(busybox), "--list"]).split():
            if not any(
                (rootfs / d / applet).exists() or (rootfs / d / applet).is_symlink()
                for d in ("bin", "usr/bin", "sbin", "usr/sbin")
            ):
                (rootfs / "bin" / applet).symlink_to("busybox")
        try:
            work.rename(final)
        except OSError:  # another session built it meanwhile
            shutil.rmtree(work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return final / "rootfs"


@functools.cache
def busybox_rootfs() -> Path:
    return _built("busybox", ["busybox-static"])


@functools.cache
def python_rootfs() -> Path:
    depends = _run(["apt-cache", "depends", "python3-minimal"])
    found = re.search(r"Depends: python(3\.\d+)-minimal", depends)
    if found is None:
        pytest.skip(f"cannot build a test image: which Python python3-minimal depends on: {depends[:200]}")
    version = found.group(1)
    return _built(
        "python",
        [
            "busybox-static",
            "libc6",
            "zlib1g",
            "libexpat1",
            "python3-minimal",
            f"python{version}-minimal",
            f"libpython{version}-minimal",
            f"libpython{version}-stdlib",
        ],
    )


@functools.cache
def shared_cache() -> ImageCache:
    """The tests' image cache: kept across sessions, so an image is unpacked once per machine."""
    return ImageCache(str(ROOT / "cache"))


@functools.cache
def python_image() -> str:
    """A rootfs tarball of ``python_rootfs()`` (uncompressed: quick to pack and to read)."""
    path = ROOT / f"python-v{FORMAT}.tar"
    if not path.exists():
        rootfs_tarball(python_rootfs(), path, compress=False)
    return str(path)


def image_sandbox(name: str | None = None, **kwargs: Any) -> SandboxRuntime:
    """A ``SandboxRuntime`` over the Python image (in the tests' cache)."""
    return SandboxRuntime(name, image=python_image(), image_cache=shared_cache(), **kwargs)


BOXES = [pytest.param(SandboxRuntime, id="host"), pytest.param(image_sandbox, id="image", marks=needs_image)]
"""The sandboxes the isolation tests run against: over the host's system, and over an image."""


def host_path(rt: LocalRuntime, relative: str) -> str:
    """Where ``relative`` (in the runtime's work directory) is on the host: a sandbox's disk
    limit and image root are mounted in its own namespace, reached through its root
    (``mount_ns.py``)."""
    assert rt.workdir is not None
    reach = getattr(rt, "_host_path", str)
    if getattr(rt, "image", None) is None:
        return reach(os.path.join(rt.workdir, relative))
    return reach(os.path.join(rt.id, "root", rt.workdir.lstrip("/"), relative))


def ns_mountinfo(ns: Any) -> str:
    """The mount table (``mountinfo``) of mount namespace ``ns`` (``mount_ns.MountNamespace``):
    read by a program entering it, as no process holds it."""
    return subprocess.run(
        [*ns.enter_args(), "cat", "/proc/self/mountinfo"], check=True, capture_output=True, text=True
    ).stdout


# -- packing ------------------------------------------------------------------------------------------


def tar_bytes(source: Path | None = None, extra: Iterable[tuple[tarfile.TarInfo, bytes | None]] = ()) -> bytes:
    """A tar of ``source``'s tree (relative names) followed by the ``extra`` members."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if source is not None:
            for path in sorted(source.rglob("*")):
                tar.add(path, arcname=str(path.relative_to(source)), recursive=False)
        for info, data in extra:
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return buf.getvalue()


def member(
    name: str, data: bytes | None = b"", *, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = ""
) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    if kind == tarfile.REGTYPE:
        info.size = len(data or b"")
        return info, data or b""
    return info, None


def rootfs_tarball(source: Path, dest: Path, *, compress: bool = True) -> Path:
    data = tar_bytes(source)
    tmp = dest.with_name(dest.name + f".{os.getpid()}.tmp")
    tmp.write_bytes(gzip.compress(data, compresslevel=1, mtime=0) if compress else data)
    tmp.rename(dest)
    return dest


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _config(diff_ids: list[str], config: dict[str, Any] | None) -> bytes:
    return json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": config or {},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
    ).encode()


def oci_blobs(layers: list[bytes], config: dict[str, Any] | None = None) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The blobs (name -> bytes) and ``index.json`` of an OCI layout of gzipped ``layers``."""
    blobs: dict[str, bytes] = {}

    def add(data: bytes) -> str:
        digest = sha(data)
        blobs["blobs/sha256/" + digest.removeprefix("sha256:")] = data
        return digest

    zipped = [gzip.compress(layer, compresslevel=1, mtime=0) for layer in layers]
    config_data = _config([sha(layer) for layer in layers], config)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": add(config_data),
                "size": len(config_data),
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": add(z), "size": len(z)}
                for z in zipped
            ],
        }
    ).encode()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": add(manifest),
                "size": len(manifest),
                "platform": {"architecture": "amd64", "os": "linux"},
            }
        ],
    }
    return blobs, index


def oci_layout(layers: list[bytes], dest: Path, config: dict[str, Any] | None = None) -> Path:
    blobs, index = oci_blobs(layers, config)
    for name, data in blobs.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(data)
    (dest / "index.json").write_text(json.dumps(index))
    (dest / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return dest


def _archive(files: dict[str, bytes], dest: Path) -> Path:
    with tarfile.open(dest, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dest


def oci_archive(layers: list[bytes], dest: Path, config: dict[str, Any] | None = None) -> Path:
    """What ``docker save`` writes since Docker 25: an OCI layout, and a ``manifest.json``."""
    blobs, index = oci_blobs(layers, config)
    manifest = json.loads(blobs["blobs/sha256/" + index["manifests"][0]["digest"].removeprefix("sha256:")])
    legacy = [
        {
            "Config": "blobs/sha256/" + manifest["config"]["digest"].removeprefix("sha256:"),
            "RepoTags": ["test:latest"],
            "Layers": ["blobs/sha256/" + d["digest"].removeprefix("sha256:") for d in manifest["layers"]],
        }
    ]
    return _archive(
        {
            "oci-layout": b'{"imageLayoutVersion": "1.0.0"}',
            "index.json": json.dumps(index).encode(),
            "manifest.json": json.dumps(legacy).encode(),
            **blobs,
        },
        dest,
    )


def docker_archive(layers: list[bytes], dest: Path, config: dict[str, Any] | None = None) -> Path:
    """The classic ``docker save`` / ``podman save`` archive: ``<id>/layer.tar`` per layer."""
    config_data = _config([sha(layer) for layer in layers], config)
    files = {f"{sha(layer)[7:19]}/layer.tar": layer for layer in layers}
    config_name = sha(config_data)[7:] + ".json"
    files[config_name] = config_data
    files["manifest.json"] = json.dumps(
        [{"Config": config_name, "RepoTags": ["test:latest"], "Layers": list(files)[: len(layers)]}]
    ).encode()
    return _archive(files, dest)
