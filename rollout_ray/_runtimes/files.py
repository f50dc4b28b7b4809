"""A runtime's file I/O from the host, confined beneath one directory whatever its programs did.

Programs own the files of their work directory: they can replace any component of a path with
a symbolic link (``answer.txt -> /etc/passwd``), a FIFO or a device. The host side (running as
root) must never follow such a link out, nor hang on a FIFO. So a path is resolved component
by component from an open directory: each directory with ``O_DIRECTORY | O_NOFOLLOW``
relative to its parent's descriptor, the file with ``O_NOFOLLOW | O_NONBLOCK``, then checked
with ``fstat`` to be a regular file. ``..`` is resolved lexically first and may not leave the
directory. Refusals are ``SandboxError``; an escaping path is ``ValueError``; a missing file is
the usual ``FileNotFoundError``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator

from .._errors import SandboxError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def components(path: str) -> list[str] | None:
    """The components of relative ``path`` after lexical normalisation (``[]`` for the
    directory itself), or ``None`` when it climbs out with ``..``."""
    norm = os.path.normpath(path)
    if norm == ".":
        return []
    parts = norm.split(os.sep)
    return None if parts[0] == ".." else parts


def _refuse(what: str, e: OSError, dir_fd: int, name: str, shown: str) -> None:
    """Turn the error of opening a link under ``O_NOFOLLOW`` (``ELOOP``, or ``ENOTDIR`` with
    ``O_DIRECTORY``) into a refusal."""
    if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return
    with contextlib.suppress(OSError):
        if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise SandboxError(f"{what}: {shown!r} is a symbolic link; links are not followed") from None


@contextlib.contextmanager
def _parent(base: str, parts: list[str], what: str, create: bool) -> Iterator[int]:
    """A descriptor of the directory holding ``parts[-1]``, reached without following links
    (made when ``create``)."""
    fd = os.open(base, _DIR_FLAGS)
    try:
        for i, name in enumerate(parts[:-1]):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                _refuse(what, e, fd, name, "/".join(parts[: i + 1]))
                raise
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _open(dir_fd: int, name: str, flags: int, what: str, shown: str) -> int:
    try:
        fd = os.open(name, flags | _FILE_FLAGS, 0o666, dir_fd=dir_fd)
    except OSError as e:
        _refuse(what, e, dir_fd, name, shown)
        if e.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
            raise SandboxError(f"{what}: {shown!r} is not a regular file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SandboxError(f"{what}: {shown!r} is not a regular file")
    return fd


def read_beneath(base: str, parts: list[str], max_bytes: int | None, what: str) -> bytes:
    """The content of regular file ``parts`` under directory ``base`` (at most ``max_bytes``)."""
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "is a directory", base)
    with _parent(base, parts, what, create=False) as dir_fd:
        fd = _open(dir_fd, parts[-1], os.O_RDONLY, what, "/".join(parts))
    with os.fdopen(fd, "rb") as f:
        return f.read() if max_bytes is None else f.read(max_bytes)


def write_beneath(base: str, parts: list[str], data: bytes, what: str) -> None:
    """Write regular file ``parts`` under directory ``base``, making its parent directories."""
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "is a directory", base)
    with _parent(base, parts, what, create=True) as dir_fd:
        fd = _open(dir_fd, parts[-1], os.O_WRONLY | os.O_CREAT, what, "/".join(parts))
    with os.fdopen(fd, "wb") as f:
        f.truncate(0)  # after the checks: O_TRUNC would have truncated whatever was there
        f.write(data)


def make_dir_beneath(base: str, parts: list[str], mode: int | None, what: str) -> None:
    """Make directory ``parts`` under ``base`` with its parents, never through a link; give it
    ``mode`` (when not ``None``)."""
    with _parent(base, [*parts, ""], what, create=True) as dir_fd:
        if mode is not None:
            os.fchmod(dir_fd, mode)


def replace_beneath(base: str, parts: list[str], data: bytes, what: str) -> None:
    """``write_beneath``, replacing a link or other non-directory at ``parts`` rather than
    refusing it."""
    with _parent(base, parts, what, create=True) as dir_fd, contextlib.suppress(FileNotFoundError, IsADirectoryError):
        os.unlink(parts[-1], dir_fd=dir_fd)
    write_beneath(base, parts, data, what)


def own_dir(path: str, what: str) -> None:
    """Check that ``path`` is a directory of this user's, no link, that no one else may write to.

    Raises:
        SandboxError: it is not (naming it, and saying to remove it).
    """
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SandboxError(
            f"{what} {path!r} is a symbolic link or not a directory of this user's; remove it "
            f"(nothing is followed or removed through it)"
        )


def remove_tree(path: str) -> None:
    """``rmtree`` that also removes read-only directories (Go's module cache makes them); a
    link at ``path`` is removed itself, never followed."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(path)
            return
    for parent, dirs, _ in os.walk(path):
        for d in dirs:
            p = os.path.join(parent, d)
            if not os.path.islink(p):  # chmod follows links: never touch outside the tree
                with contextlib.suppress(OSError):
                    os.chmod(p, 0o700)
    shutil.rmtree(path, ignore_errors=True)
