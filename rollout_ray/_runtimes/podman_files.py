"""A Podman container's files, moved through ``podman cp`` as tar streams.

``podman cp`` resolves every path, and every link the agent planted, inside the container's
root, never the host's; a read streams the archive and stops at ``max_bytes`` (a file of the
container may be as large as its disk), a write sends one small tar.
"""

from __future__ import annotations

import io
import subprocess
import tarfile

from .podman_cli import CALL_TIMEOUT


def parents(path: str) -> list[tuple[str, int, bytes | None]]:
    """Tar entries of absolute ``path``'s directories (``path`` included), mode 0755."""
    parts = [p for p in path.split("/") if p]
    return [("/".join(parts[:depth]), 0o755, None) for depth in range(1, len(parts) + 1)]


def tar(entries: list[tuple[str, int, bytes | None]]) -> bytes:
    """A tar of ``(name, mode, content)``: a directory where the content is ``None``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, mode, content in entries:
            entry = tarfile.TarInfo(name)
            entry.mode, entry.type = mode, tarfile.DIRTYPE if content is None else tarfile.REGTYPE
            entry.size = len(content or b"")
            archive.addfile(entry, None if content is None else io.BytesIO(content))
    return buffer.getvalue()


def read_streamed(source: str, max_bytes: int | None) -> bytes | str:
    """The file ``podman cp source -`` streams as a tar, reading no more than ``max_bytes`` of
    it (the client is killed then): a file of the container may be as large as its disk. The
    reason as a string when it is no regular file (a directory's tar would be its whole tree)."""
    proc = subprocess.Popen(  # noqa: S603 - podman from PATH as podman_cli.podman; no shell
        ["podman", "cp", source, "-"],  # noqa: S607 - podman from PATH, as podman_cli.podman
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
                member = archive.next()
                if member is None or not member.isfile():
                    return "not a regular file (a directory or a link is refused): give a file's path"
                stream = archive.extractfile(member)
                assert stream is not None
                return stream.read(member.size if max_bytes is None else min(member.size, max(max_bytes, 0)))
        except tarfile.TarError:
            proc.kill()
            proc.wait(CALL_TIMEOUT)
            assert proc.stderr is not None
            return proc.stderr.read(4096).decode(errors="replace").strip() or "podman cp wrote no archive"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(CALL_TIMEOUT)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
