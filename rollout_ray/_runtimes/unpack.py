"""Applying an image's layers to a directory: in order, whiteouts honoured, nothing escapes.

A layer is a tar stream. ``Unpacker(root).apply(tar)`` writes its members under ``root`` — a
directory only this process writes to (the cache's private build directory) — so that:

* no member lands outside ``root``: a name is made relative (a leading ``/`` dropped) and its
  ``..`` resolved lexically, and one that climbs out refuses the image; a directory link met
  on the way (``lib -> usr/lib``, ``x -> /``) is resolved *inside* ``root``, as the sandbox will
  see it, never on the host; the last component is never followed (a file replaces a link
  there, it does not write through it);
* symbolic links are kept as they are (inside the sandbox a link to ``/etc/shadow`` is the
  image's own ``/etc/shadow``); a hard link must point at a file of the tree;
* no device nodes (skipped), no setuid, setgid or file capabilities, no ownership: every file
  is owned by the user who unpacks, which inside the sandbox is the sandbox user. Modes (but
  those bits) and file mtimes are kept: Python's bytecode caches stay valid;
* ``layered`` (an OCI or ``docker save`` layer): ``.wh.NAME`` deletes ``NAME`` from the layers
  below and ``.wh..wh..opq`` empties its directory of what the layers below put there.

``max_bytes`` bounds what the layers may write in all, as the disk counts it: file content in
whole blocks, and a block for each directory, link and file's metadata (an archive of empty
directories and long link targets takes disk too); ``max_inodes`` bounds the files,
directories and links made. A small archive that unpacks to more (a compression bomb) is
refused before it fills the disk or its inode table. A whiteout must name a file (``.wh.``,
``.wh..`` and ``.wh...`` name none: refused). ``apply_layer`` reads one layer
(gzip, bzip2, xz or plain tar) and checks its digests, as stored and uncompressed, as it
streams by.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import os
import shutil
import stat
import tarfile
import zlib
from typing import IO, Any

from .._errors import SandboxError

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
MAX_LINKS = 40
"""Directory links followed while resolving one name, as the kernel allows."""
CHUNK = 1 << 20
BLOCK = 4096
"""What the disk takes at least for a file's content, a directory or a long link's target."""


def relative_parts(name: str, what: str) -> list[str]:
    """The components of member ``name`` beneath the root (``..`` resolved lexically).

    Raises:
        SandboxError: the name climbs out of the root.
    """
    parts: list[str] = []
    for part in name.split("/"):
        if part in ("", "."):
            continue
        if part != "..":
            parts.append(part)
        elif parts:
            parts.pop()
        else:
            raise SandboxError(f"{what} {name!r} climbs out of the image; refusing the image")
    return parts


def _remove(path: str) -> None:
    """Remove whatever ``path`` is (a directory with its tree), never following a link."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


class Unpacker:
    """Applies layers, in the order given, to ``root`` (see the module docstring)."""

    def __init__(
        self, root: str, *, max_bytes: int | None = None, max_inodes: int | None = None, what: str = "image"
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.max_inodes = max_inodes
        self.what = what
        self.written = 0
        """Bytes written so far as the disk counts them: content in blocks, a block per inode."""
        self.inodes = 0
        """Files, directories and links made so far (removed ones are not taken back)."""
        self.skipped: list[str] = []
        """Members left out: device nodes and kinds a rootfs cannot hold."""

    def _path(self, parts: list[str]) -> str:
        return os.path.join(self.root, *parts)

    def resolve(self, parts: list[str], *, create: bool = True) -> list[str] | None:
        """The real components, beneath the root, of directory ``parts``: links followed inside
        the root (an absolute target starts again at the root, ``..`` stops there), missing
        directories made when ``create`` (else ``None``), a non-directory in the way replaced."""
        real: list[str] = []
        todo = list(parts)
        links = 0
        while todo:
            name = todo.pop(0)
            if name == "..":
                real = real[:-1]
                continue
            path = [*real, name]
            try:
                st = os.lstat(self._path(path))
            except FileNotFoundError:
                if not create:
                    return None
                os.mkdir(self._path(path), 0o755)
                real = path
                continue
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_LINKS:
                    raise SandboxError(f"{self.what}: too many links resolving {'/'.join(parts)!r}")
                target = os.readlink(self._path(path))
                real = [] if target.startswith("/") else real
                todo = [p for p in target.split("/") if p not in ("", ".")] + todo
            elif stat.S_ISDIR(st.st_mode):
                real = path
            elif create:  # a file where a later layer has a directory
                os.unlink(self._path(path))
                os.mkdir(self._path(path), 0o755)
                real = path
            else:
                return None
        return real

    def apply(self, tar: tarfile.TarFile, *, layered: bool) -> None:
        """Apply every member of ``tar`` (read as a stream, in order)."""
        created: set[tuple[str, ...]] = set()
        for member in tar:
            parts = relative_parts(member.name, f"{self.what}: member")
            if not parts:
                continue  # the root itself: its mode is ours
            name = parts[-1]
            parent = self.resolve(parts[:-1])
            assert parent is not None  # made when missing
            if layered and name == OPAQUE:
                self._opaque(parent, created)
            elif layered and name.startswith(WHITEOUT):
                if name[len(WHITEOUT) :] in ("", ".", ".."):
                    raise SandboxError(f"{self.what}: whiteout {member.name!r} names no file; refusing the image")
                hidden = (*parent, name[len(WHITEOUT) :])
                if hidden not in created:  # a whiteout hides the layers below, not its own
                    _remove(self._path(list(hidden)))
            elif self._write(member, tar, [*parent, name]):
                created.add((*parent, name))

    def _opaque(self, directory: list[str], created: set[tuple[str, ...]]) -> None:
        for child in os.listdir(self._path(directory)):
            if (*directory, child) not in created:
                _remove(self._path([*directory, child]))

    def _write(self, member: tarfile.TarInfo, tar: tarfile.TarFile, parts: list[str]) -> bool:
        """Write one member at ``parts`` (its parent resolved); False when skipped."""
        path = self._path(parts)
        if member.isdir():
            st = _lstat(path)
            if st is None or not stat.S_ISDIR(st.st_mode):
                self._charge(BLOCK)
                _remove(path)
                os.mkdir(path, 0o755)
            os.chmod(path, member.mode & 0o1777)  # sticky kept (/tmp), setgid dropped
            return True
        if member.isfile():
            self._charge(BLOCK + -(-member.size // BLOCK) * BLOCK)
            _remove(path)
            self._copy(member, tar, path)
        elif member.issym():
            self._charge(BLOCK + len(os.fsencode(member.linkname)))
            _remove(path)
            os.symlink(member.linkname, path)
        elif member.islnk():
            self._charge(0)  # a name, no inode: counted so that names alone stay bounded
            self._hard_link(member, path)
        elif member.isfifo():
            self._charge(BLOCK)
            _remove(path)
            os.mkfifo(path, member.mode & 0o777)
        else:
            self.skipped.append(member.name)  # device nodes, and kinds a rootfs cannot hold
            return False
        os.utime(path, ns=(int(member.mtime * 10**9),) * 2, follow_symlinks=False)
        return True

    def _charge(self, size: int) -> None:
        """Count one more inode taking ``size`` bytes of disk; refuse the image past a bound."""
        self.written += size
        self.inodes += 1
        if self.max_bytes is not None and self.written > self.max_bytes:
            raise SandboxError(
                f"{self.what} unpacks to more than {self.max_bytes} bytes, the image "
                f"cache's bound; raise it (ROLLOUT_RAY_IMAGE_CACHE_BYTES) to use this image"
            )
        if self.max_inodes is not None and self.inodes > self.max_inodes:
            raise SandboxError(
                f"{self.what} unpacks to more than {self.max_inodes} files and directories, the "
                f"image cache's bound; raise it (ROLLOUT_RAY_IMAGE_CACHE_INODES) to use this image"
            )

    def _copy(self, member: tarfile.TarInfo, tar: tarfile.TarFile, path: str) -> None:
        source = tar.extractfile(member)
        assert source is not None  # a regular file
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(source, out, CHUNK)
            os.fchmod(out.fileno(), member.mode & 0o777)  # no setuid, setgid or sticky

    def _hard_link(self, member: tarfile.TarInfo, path: str) -> None:
        parts = relative_parts(member.linkname, f"{self.what}: hard link {member.name!r} ->")
        parent = self.resolve(parts[:-1], create=False) if parts else None
        source = None if parent is None else self._path([*parent, parts[-1]])
        st = None if source is None else _lstat(source)
        if st is None or stat.S_ISDIR(st.st_mode):
            raise SandboxError(
                f"{self.what}: hard link {member.name!r} -> {member.linkname!r} points at no "
                f"file of the image; refusing the image"
            )
        assert source is not None
        if source != path:
            _remove(path)
            os.link(source, path, follow_symlinks=False)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def usage(root: str) -> tuple[int, int]:
    """``(bytes, inodes)`` ``root`` takes on disk: allocated blocks, and at least a block per
    inode (a tmpfs allocates none to a directory or a link, but holds their metadata in
    memory); a file with several links counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(parent, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += max(st.st_blocks * 512, BLOCK)
    return total, len(seen)


# -- reading a layer, its digests checked as it streams by ------------------------------------


class _Digest:
    """A reader that hashes what passes through it."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.sha = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.source.read(n)
        self.sha.update(data)
        return data  # type: ignore[no-any-return]

    def drain(self) -> str:
        """Read to the end; the digest of everything read."""
        while self.read(CHUNK):
            pass
        return "sha256:" + self.sha.hexdigest()


class _Prefixed:
    """``head`` (already read from ``rest``) followed by the rest."""

    def __init__(self, head: bytes, rest: Any) -> None:
        self.head, self.rest = head, rest

    def read(self, n: int = -1) -> bytes:
        if not self.head:
            return self.rest.read(n)  # type: ignore[no-any-return]
        if n < 0:
            data, self.head = self.head + self.rest.read(), b""
            return data  # type: ignore[no-any-return]
        data, self.head = self.head[:n], self.head[n:]
        return data


def _decompressed(raw: _Digest, what: str) -> Any:
    head = raw.read(6)
    stream = _Prefixed(head, raw)
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=stream)  # type: ignore[call-overload]
    if head.startswith(b"BZh"):
        return bz2.BZ2File(stream)  # type: ignore[call-overload]
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(stream)  # type: ignore[arg-type]
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        raise SandboxError(
            f"{what} is compressed with zstd, which this Python cannot read; export it "
            f"uncompressed or with gzip (docker save, skopeo copy --dest-compress-format gzip)"
        )
    return stream


def apply_layer(
    blob: IO[bytes],
    unpacker: Unpacker,
    *,
    layered: bool,
    what: str,
    digest: str | None = None,
    diff_id: str | None = None,
) -> None:
    """Apply one layer read from ``blob``, checking it against ``digest`` as stored and
    ``diff_id`` uncompressed (each when given)."""
    raw = _Digest(blob)
    plain = _Digest(_decompressed(raw, what))
    try:
        with tarfile.open(fileobj=plain, mode="r|") as tar:  # type: ignore[call-overload]
            unpacker.apply(tar, layered=layered)
        got = {"diff_id": plain.drain(), "digest": raw.drain()}
    except (tarfile.TarError, OSError, EOFError, lzma.LZMAError, zlib.error) as e:
        if isinstance(e, OSError) and e.errno is not None:  # the disk, not the data
            raise
        raise SandboxError(f"{what} is not a readable tar layer: {e}") from None
    for kind, want in (("digest", digest), ("diff_id", diff_id)):
        if want is not None and got[kind] != want:
            raise SandboxError(
                f"{what}: its {kind} is {got[kind]} but the image says {want}: the archive is "
                f"damaged or was altered; refusing it"
            )
