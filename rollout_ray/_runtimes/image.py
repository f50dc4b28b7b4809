"""A task's image: which format it is, what names it, how its layers are read and checked.

``locate(spec)`` turns what a task gives as its image into an ``Image``: its ``key`` (the
digest naming it in the cache) and a way to ``unpack`` it, layers in order, into a directory.

* an OCI image layout (``oci-layout``, ``index.json``, ``blobs/sha256/...``), as a directory
  or a tar of one — what ``docker save`` writes since Docker 25 (with a ``manifest.json``
  beside it); named by its config's digest (the image ID). An index of several platforms gives this
  machine's (``linux/amd64``, ...);
* a ``docker save`` / ``podman save`` archive (``manifest.json``, a config, a ``layer.tar``
  per layer); named by its config's digest (the image ID);
* a plain rootfs tarball (``.tar``, ``.tar.gz``, ``.tar.xz``, ...): one layer, no whiteouts;
  named by the sha256 of the file (computed once per process and file version);
* a name in the local store of ``podman`` or ``docker`` (anything that is no path and names
  no file): named by the engine's image ID, exported with ``save`` only when not cached (the
  export must prove that ID: its config's, its manifest's or its index's digest).

Images of every file format are named by what determines their tree: the config's digest
(the config lists each layer's uncompressed digest, checked as it is applied), or the whole
file's for a rootfs tarball. ``unpack`` sets ``proved`` to the digest its content showed; the
cache files a tree under ``key`` only when the two agree, so no archive can put its tree
under another image's name (a config must be an image config: ``rootfs.diff_ids``).

Every digest is checked as it is read: the manifest and config against their descriptors,
each layer as stored against the manifest and, uncompressed, against the config's
``rootfs.diff_ids``. A mismatch refuses the image with one line. Layers are gzip, bzip2, xz
or uncompressed tar; zstd is refused (not in Python's standard library before 3.14).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import re
import tarfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from .._errors import SandboxError
from . import engine
from .unpack import CHUNK, Unpacker, apply_layer, relative_parts

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
ARCHIVE_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2")
_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")


@dataclass(frozen=True)
class ImageConfig:
    """What of an image's config a sandbox uses."""

    env: tuple[str, ...] = ()
    """``NAME=value`` entries (``Env``): the programs' environment before the runtime's own."""
    working_dir: str | None = None
    """``WorkingDir``: where programs start (the runtime's work directory), if the image says."""

    @classmethod
    def parse(cls, config: dict[str, Any]) -> ImageConfig:
        inner = config.get("config") or {}
        env = tuple(e for e in inner.get("Env") or () if isinstance(e, str) and "=" in e)
        working_dir = inner.get("WorkingDir") or None
        return cls(env, working_dir if isinstance(working_dir, str) else None)


class Image(ABC):
    """An image where it lies: ``key`` names its unpacked tree; ``unpack`` makes that tree."""

    format: str = ""

    def __init__(self, spec: str, key: str) -> None:
        self.spec = spec
        self.key = key
        self.proved: str | None = None
        """The digest the content read by the last ``unpack`` proved (``None`` before)."""

    @abstractmethod
    def unpack(self, unpacker: Unpacker, scratch: str) -> ImageConfig:
        """Apply the layers with ``unpacker`` (``scratch``: a private directory for temporary
        files) and return the config. Raises ``SandboxError``."""


def locate(spec: str) -> Image:
    """The image ``spec`` names (see the module docstring).

    Raises:
        SandboxError: no such file, an unknown format, a damaged archive, no engine has it.
    """
    path = os.path.abspath(os.path.expanduser(spec))
    if os.path.isdir(path):
        return _layout(spec, path)
    if os.path.isfile(path):
        st = os.stat(path)
        return _archive(spec, path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    if spec.startswith(("/", ".", "~")) or spec.endswith(ARCHIVE_SUFFIXES):
        raise SandboxError(f"image {spec!r}: no such file or directory")
    return _EngineImage(spec)


# -- reading an image's files, from a directory or a tar ----------------------------------------


class _Files(ABC):
    @abstractmethod
    def open(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]: ...

    @abstractmethod
    def exists(self, name: str) -> bool: ...

    def read(self, name: str) -> bytes:
        with self.open(name) as f:
            return f.read()

    def json(self, name: str, spec: str) -> Any:
        try:
            return json.loads(self.read(name))
        except (OSError, KeyError, ValueError) as e:
            raise SandboxError(f"image {spec!r}: cannot read {name}: {e}") from None


class _DirFiles(_Files):
    def __init__(self, root: str) -> None:
        self.root = root

    def _path(self, name: str) -> str:
        return os.path.join(self.root, *relative_parts(name, "image file"))

    def open(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        return open(self._path(name), "rb")

    def exists(self, name: str) -> bool:
        return os.path.isfile(self._path(name))


class _TarFiles(_Files):
    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        members = tar.getmembers()
        self.members = {name: m for m in members if m.isfile() and (name := _inside(m.name))}
        for link in (m for m in members if m.issym()):  # docker save links a repeated layer.tar
            target = _inside(os.path.join(os.path.dirname(link.name), link.linkname))
            if target in self.members and (name := _inside(link.name)):
                self.members[name] = self.members[target]

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        member = self.members.get("/".join(relative_parts(name, "image file")))
        if member is None:
            raise KeyError(f"{name} is not in the archive")
        f = self.tar.extractfile(member)
        assert f is not None
        with f:
            yield f

    def exists(self, name: str) -> bool:
        return "/".join(relative_parts(name, "image file")) in self.members


def _inside(name: str) -> str | None:
    """A member's name in an archive (``None`` for one climbing out: never an image file)."""
    try:
        return "/".join(relative_parts(name, "image file"))
    except SandboxError:
        return None


@contextlib.contextmanager
def _files(spec: str, path: str) -> Iterator[_Files]:
    if os.path.isdir(path):
        yield _DirFiles(path)
        return
    try:
        tar = tarfile.open(path, "r:*")  # noqa: SIM115 - entered below, once it is known to open
    except (tarfile.TarError, OSError) as e:
        raise SandboxError(f"image {spec!r} is neither a directory nor a tar archive: {e}") from None
    with tar:
        try:
            yield _TarFiles(tar)
        except tarfile.TarError as e:
            raise SandboxError(f"image {spec!r}: damaged archive: {e}") from None


def _check(data: bytes, digest: str, what: str) -> None:
    got = "sha256:" + hashlib.sha256(data).hexdigest()
    if got != digest:
        raise SandboxError(
            f"{what}: its digest is {got} but the image says {digest}: the archive is "
            f"damaged or was altered; refusing it"
        )


def _blob(digest: Any, spec: str) -> str:
    if not isinstance(digest, str) or not DIGEST.match(digest):
        raise SandboxError(f"image {spec!r}: unsupported digest {digest!r} (sha256 only)")
    return "blobs/sha256/" + digest.removeprefix("sha256:")


# -- OCI layouts ---------------------------------------------------------------------------------


def _arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386"}.get(machine, machine)


def _pick(index: dict[str, Any], spec: str) -> dict[str, Any]:
    """The descriptor, among an index's, of this machine's image."""
    found = [m for m in index.get("manifests") or () if isinstance(m, dict)]
    ours = [m for m in found if (m.get("platform") or {}).get("architecture") == _arch()]
    unplatformed = [m for m in found if not m.get("platform")]
    for candidates in (ours, unplatformed):
        if len(candidates) == 1:
            return candidates[0]
    raise SandboxError(
        f"image {spec!r}: its index lists {len(found)} images and not exactly one for "
        f"linux/{_arch()}; save only the one you mean"
    )


def _config_digest(manifest: dict[str, Any], spec: str) -> str:
    digest = (manifest.get("config") or {}).get("digest")
    _blob(digest, spec)  # refuses anything but a sha256 digest
    return str(digest)


def _manifest(files: _Files, spec: str) -> tuple[tuple[str, ...], dict[str, Any]]:
    """(digests, manifest) of the image an OCI layout's ``index.json`` leads to: the digests
    of the indexes on the way and of the manifest (last)."""
    document = files.json("index.json", spec)
    chain: list[str] = []
    for _ in range(4):  # an index may point at an index (one per platform)
        descriptor = _pick(document, spec)
        digest = descriptor.get("digest")
        chain.append(str(digest))
        data = _read(files, _blob(digest, spec), spec)
        _check(data, str(digest), f"image {spec!r}: manifest {digest}")  # a str: _blob refused any other
        document = json.loads(data)
        if descriptor.get("mediaType") not in _INDEX_TYPES and "layers" in document:
            return tuple(chain), document
    raise SandboxError(f"image {spec!r}: index.json leads to no image manifest")


def _read(files: _Files, name: str, spec: str) -> bytes:
    try:
        return files.read(name)
    except (OSError, KeyError):
        raise SandboxError(f"image {spec!r}: {name} is missing from the image") from None


class _LayoutImage(Image):
    format = "oci"

    def __init__(self, spec: str, path: str, key: str, manifest_keys: tuple[str, ...]) -> None:
        super().__init__(spec, key)
        self.path = path
        self.manifest_keys = manifest_keys
        """The digests of its manifest and of the indexes leading to it."""

    def unpack(self, unpacker: Unpacker, scratch: str) -> ImageConfig:
        with _files(self.spec, self.path) as files:
            _, manifest = _manifest(files, self.spec)
            config_digest = _config_digest(manifest, self.spec)
            data = _read(files, _blob(config_digest, self.spec), self.spec)
            _check(data, config_digest, f"image {self.spec!r}: config")
            config = _image_config(data, self.spec)
            layers = [d.get("digest") for d in manifest.get("layers") or ()]
            _apply_all(files, [_blob(d, self.spec) for d in layers], layers, config, unpacker, self.spec)
        self.proved = config_digest
        return ImageConfig.parse(config)


def _image_config(data: bytes, spec: str) -> dict[str, Any]:
    """An image config (its ``rootfs.diff_ids`` a list): anything else (a manifest passed off
    as a config, say) is refused."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    try:
        config = json.loads(data)
    except ValueError:
        config = None
    rootfs = config.get("rootfs") if isinstance(config, dict) else None
    if not isinstance(rootfs, dict) or not isinstance(rootfs.get("diff_ids"), list):
        raise SandboxError(f"image {spec!r}: its config {digest} is no image config (no rootfs.diff_ids); refusing it")
    assert isinstance(config, dict)
    return config


def _apply_all(
    files: _Files, names: list[str], digests: list[str | None], config: dict[str, Any], unpacker: Unpacker, spec: str
) -> None:
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    if len(diff_ids) != len(names):
        raise SandboxError(f"image {spec!r}: {len(names)} layers but its config lists {len(diff_ids)} diff_ids")
    for i, (name, digest, diff_id) in enumerate(zip(names, digests, diff_ids)):
        what = f"image {spec!r}: layer {i + 1} of {len(names)}"
        if not files.exists(name):
            raise SandboxError(f"{what} ({name}) is missing from the image")
        with files.open(name) as blob:
            apply_layer(blob, unpacker, layered=True, what=what, digest=digest, diff_id=diff_id)


def _layout(spec: str, path: str) -> Image:
    if not os.path.isfile(os.path.join(path, "index.json")):
        raise SandboxError(
            f"image {spec!r} is a directory but no OCI image layout (no index.json); pack a "
            f"root filesystem as a tarball instead (tar -C DIR -czf rootfs.tar.gz .)"
        )
    with _files(spec, path) as files:
        manifest_keys, manifest = _manifest(files, spec)
    return _LayoutImage(spec, path, _config_digest(manifest, spec), manifest_keys)


# -- archives: an OCI layout in a tar, docker save, a rootfs tarball --------------------------


class _DockerArchive(Image):
    format = "docker-archive"

    def __init__(self, spec: str, path: str, key: str) -> None:
        super().__init__(spec, key)
        self.path = path

    def unpack(self, unpacker: Unpacker, scratch: str) -> ImageConfig:
        with _files(self.spec, self.path) as files:
            entry = _docker_entry(files, self.spec)
            data = _read(files, entry["Config"], self.spec)
            config = _image_config(data, self.spec)
            names = [str(n) for n in entry.get("Layers") or ()]
            _apply_all(files, names, [None] * len(names), config, unpacker, self.spec)
        self.proved = "sha256:" + hashlib.sha256(data).hexdigest()
        return ImageConfig.parse(config)


def _docker_entry(files: _Files, spec: str) -> dict[str, Any]:
    entries = files.json("manifest.json", spec)
    if not isinstance(entries, list) or len(entries) != 1 or not isinstance(entries[0], dict):
        count = len(entries) if isinstance(entries, list) else "no"
        raise SandboxError(f"image {spec!r}: the archive holds {count} images; save exactly one (docker save NAME)")
    if not isinstance(entries[0].get("Config"), str):
        raise SandboxError(f"image {spec!r}: manifest.json names no config")
    return entries[0]


class _RootfsTarball(Image):
    format = "rootfs"

    def __init__(self, spec: str, path: str, key: str) -> None:
        super().__init__(spec, key)
        self.path = path

    def unpack(self, unpacker: Unpacker, scratch: str) -> ImageConfig:
        with open(self.path, "rb") as f:
            apply_layer(f, unpacker, layered=False, what=f"image {self.spec!r}", digest=self.key)
        self.proved = self.key  # apply_layer checked the whole file against it
        return ImageConfig()


@functools.lru_cache(maxsize=256)
def _archive(spec: str, path: str, version: tuple[int, ...]) -> Image:
    """The image in archive ``path`` (cached per file ``version``: hashing a tarball is slow)."""
    with _files(spec, path) as files:
        if files.exists("index.json") and files.exists("oci-layout"):
            manifest_keys, manifest = _manifest(files, spec)
            return _LayoutImage(spec, path, _config_digest(manifest, spec), manifest_keys)
        if files.exists("manifest.json"):
            config_name = _docker_entry(files, spec)["Config"]
            key = "sha256:" + hashlib.sha256(_read(files, config_name, spec)).hexdigest()
            return _DockerArchive(spec, path, key)
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return _RootfsTarball(spec, path, "sha256:" + sha.hexdigest())


class _EngineImage(Image):
    format = "engine"

    def __init__(self, spec: str) -> None:
        self.engine, key = engine.lookup(spec)
        super().__init__(spec, key)

    def unpack(self, unpacker: Unpacker, scratch: str) -> ImageConfig:
        archive = os.path.join(scratch, "image.tar")
        engine.export(self.engine, self.spec, archive)
        try:
            st = os.stat(archive)
            exported = _archive(self.spec, archive, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
            config = exported.unpack(unpacker, scratch)
        finally:
            os.unlink(archive)
        # The engine's ID is its image's config digest (podman, docker's own store) or its
        # index's or manifest's (docker's containerd store): the export must prove one of them.
        if self.key == exported.proved or self.key in getattr(exported, "manifest_keys", ()):
            self.proved = self.key
        return config
