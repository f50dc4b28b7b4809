"""The files of a run directory, opened relative to the directory's descriptor, following no link.

A run directory can be writable by others (a shared disk, a team's ``runs/``), and whoever can
write in it can plant a link where the run will write (``.lock``, ``manifest.json.tmp``, a
shard's ``.tmp``) to have the run overwrite a file elsewhere. So, in a run directory:

- The directory is opened by its own path, and is refused when that path is a link; the
  directories above it are the caller's to choose (they are followed, as any path).
- Everything inside is opened relative to the directory's descriptor, with ``O_NOFOLLOW``:
  a link, or anything but a regular file (a folder where a folder is expected), is an error
  naming it (``CorruptRun``), never followed.
- A file is replaced whole: written under ``<name>.tmp``, created with ``O_EXCL`` (a regular
  leftover of a crashed write is removed first, never written through), fsynced, renamed onto
  its name within the directory, and the directory fsynced.
- Removal goes by descriptor too: a link inside is removed, never followed.

Every file a run directory holds is opened here; ``run_layout`` says where each is. A new
file (a status, a control token) is a name in ``run_layout`` and, for example::

    with RunLayout.of(run_dir).open() as run:
        run.write_bytes(STATUS, data)          # atomic; data = run.read_bytes(STATUS)
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Self

import pyarrow as pa

from .._errors import CorruptRun

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
# O_NONBLOCK: a FIFO planted under a file's name must not block its open (it is then refused).
_READ = os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW
_LOCK = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | _NOFOLLOW

TMP_SUFFIX = ".tmp"
"""A file being written is ``<name>.tmp`` until it is complete."""


class RunFiles:
    """An open directory of a run (the run directory, or a folder in it) and the files in it.

    ``path`` names it in messages only: nothing is opened by path once it is open. Close it
    (or use it as a context manager); a folder opened from it is closed on its own.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, create: bool = False, within: Path | None = None) -> RunFiles:
        """Open the run directory ``path`` (making it, and its parents, when ``create``).

        ``within``: a directory above ``path`` that the caller chose (the viewer's root):
        every directory from there down to ``path`` is opened without following a link.

        Raises:
            FileNotFoundError: ``path`` does not exist (and ``create`` is off).
            NotADirectoryError: ``path`` is not a directory.
            CorruptRun: ``path``, or a directory below ``within``, is a link (or not a directory).
        """
        path = Path(path)
        parts = () if within is None else path.relative_to(within).parts
        if not parts:
            if create:
                os.makedirs(path.parent, exist_ok=True)  # the parents are the caller's choice
            return cls(_open_directory(None, str(path), path, create=create), path)
        assert within is not None
        here = cls(os.open(within, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), within)  # the caller's choice
        for part in parts:
            with here:
                here = here.folder(part, create=create)
        return here

    def folder(self, name: str, *, create: bool = False) -> RunFiles:
        """The folder ``name`` in this directory (made when ``create``).

        Raises:
            FileNotFoundError: it does not exist (and ``create`` is off).
            CorruptRun: it is a link, or not a directory.
        """
        return RunFiles(_open_directory(self.fd, name, self.path / name, create=create), self.path / name)

    @property
    def fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path} is closed; open the run directory again")
        return self._fd

    def names(self) -> list[str]:
        """The names in this directory (links included: they are not followed)."""
        return os.listdir(self.fd)

    def exists(self, name: str) -> bool:
        """Whether ``name`` is there, whatever it is (a link is not followed)."""
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def stat(self, name: str) -> os.stat_result:
        """The status of the regular file ``name``.

        Raises:
            FileNotFoundError: there is none.
            CorruptRun: it is a link, or not a regular file.
        """
        st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        _check_regular(st, self.path / name)
        return st

    def reader(self, name: str) -> BinaryIO:
        """The regular file ``name``, open for reading (unbuffered: Parquet reads ranges).

        Raises:
            FileNotFoundError: there is none.
            CorruptRun: it is a link, or not a regular file.
        """
        fd = self._open(name, _READ)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)

    def arrow_reader(self, name: str) -> pa.NativeFile:
        """The regular file ``name``, open for Arrow (Parquet) to read. Raises as ``reader``.

        A file of Arrow's own, not a Python file: Arrow's I/O threads read ahead, and one that
        releases a Python file's buffer as the interpreter exits aborts the process. It is
        opened through this process's descriptor of the file checked here (``/proc/self/fd``),
        which names that file, not the path: nothing swapped in since is read.
        """
        with self.reader(name) as f:
            return pa.OSFile(f"/proc/self/fd/{f.fileno()}")

    def read_bytes(self, name: str) -> bytes:
        """The content of the regular file ``name``. Raises as ``reader``."""
        with self.reader(name) as f:
            return f.read()

    @contextmanager
    def replacing(self, name: str, *, mode: int = 0o644) -> Iterator[BinaryIO]:
        """A file to write ``name``'s new content to: once the block ends without an error, it
        replaces ``name`` atomically and durably; on an error, ``name`` is left as it was.
        The new file has permissions ``mode``, whatever the umask.

        Raises:
            CorruptRun: ``name`` or ``<name>.tmp`` is a link, or not a regular file.
        """
        tmp = name + TMP_SUFFIX
        if self.exists(name):
            self.stat(name)  # a link planted under the final name is refused too, not replaced
        fd = self._create(tmp)
        os.fchmod(fd, mode)
        f = os.fdopen(fd, "wb")
        try:
            with f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with _ignoring_missing():
                os.unlink(tmp, dir_fd=self.fd)
            raise
        self.fsync()

    def write_bytes(self, name: str, data: bytes, *, mode: int = 0o644) -> None:
        """Replace ``name`` with ``data``, atomically and durably. Raises as ``replacing``."""
        with self.replacing(name, mode=mode) as f:
            f.write(data)

    def lock_file(self, name: str) -> int:
        """A descriptor of the regular file ``name`` (created if missing) to ``flock``: the
        caller owns it. Refused when it is a link, or has another name elsewhere (a hard
        link: writing the holder's pid in it would write there).

        Raises:
            CorruptRun: ``name`` is a link, not a regular file, or a hard link.
        """
        fd = self._open(name, _LOCK, mode=0o644)
        st = os.fstat(fd)
        if st.st_nlink != 1:
            os.close(fd)
            raise CorruptRun(
                self.path / name,
                f"{self.path / name} has {st.st_nlink} names (a hard link): a run's "
                "lock is its own file; remove it, or use another directory",
            )
        os.set_blocking(fd, True)
        return fd

    def remove_all(self, *, keep: Iterable[str] = (), last: str | None = None) -> None:
        """Remove everything in this directory but ``keep``, ``last`` last; links inside are
        removed, never followed."""
        kept = set(keep)
        names = sorted((n for n in self.names() if n not in kept), key=lambda n: n == last)
        for name in names:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=self.fd)  # descriptor-based: follows no link
            else:
                os.unlink(name, dir_fd=self.fd)
        self.fsync()

    def fsync(self) -> None:
        """Make this directory's entries (a rename, a removal) durable."""
        os.fsync(self.fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _open(self, name: str, flags: int, mode: int = 0o644) -> int:
        try:
            fd = os.open(name, flags, mode, dir_fd=self.fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                _check_regular(os.stat(name, dir_fd=self.fd, follow_symlinks=False), self.path / name)
            raise
        try:
            _check_regular(os.fstat(fd), self.path / name)
        except CorruptRun:
            os.close(fd)
            raise
        return fd

    def _create(self, name: str) -> int:
        """A new, empty file ``name``; a regular leftover there (a crashed write) is removed."""
        for _ in range(2):
            try:
                return os.open(name, _NEW_FILE, 0o644, dir_fd=self.fd)
            except FileExistsError:
                self.stat(name)  # a link, a folder, a FIFO: refused
                with _ignoring_missing():
                    os.unlink(name, dir_fd=self.fd)
        raise CorruptRun(
            self.path / name,
            f"{self.path / name} keeps reappearing while it is written; "
            "another process writes this run directory: stop it",
        )


def _open_directory(dir_fd: int | None, name: str, path: Path, *, create: bool) -> int:
    if create:
        with suppress(FileExistsError):
            os.mkdir(name, dir_fd=dir_fd)
    try:
        return os.open(name, _DIRECTORY, dir_fd=dir_fd)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        raise CorruptRun.link(path)
    if dir_fd is None:  # the caller's path, not a part of a run
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
    raise CorruptRun(path, f"{path} is not a directory; a run directory's {path.name} must be one: move it aside")


def _check_regular(st: os.stat_result, path: Path) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise CorruptRun.link(path)
    if not stat.S_ISREG(st.st_mode):
        raise CorruptRun(
            path, f"{path} is not a regular file; a run directory holds only files and its folders: move it aside"
        )


@contextmanager
def _ignoring_missing() -> Iterator[None]:
    with suppress(FileNotFoundError):
        yield
