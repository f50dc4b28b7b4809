"""The host's end of its guardian's socket: leases the guardian keeps until it has cleaned up.

A sandbox over a cached image (or a snapshot) holds a lease on it: a ``flock`` the kernel
drops when the holding process dies. But the layer stays mounted (in the sandbox's mount
namespace, and in the namespaces of its execs) until the host's guardian has killed their
processes, a moment later; an eviction in between would remove a layer still mounted. So
the host hands the guardian a copy of each lease's descriptor (``hold``): a lock lives as
long as any copy of its descriptor, so it now lasts until the guardian, done unmounting,
closes its copies (``guardian.let_go``). A lease the host lets go of itself is ``drop``ped.

A descriptor sent over the socket is in flight from the moment ``sendmsg`` returns, even if
the host dies before the guardian reads it: nothing is ever unheld in between.
"""

from __future__ import annotations

import itertools
import os
import socket
import sys
import threading


class Keeper:
    """Hands lease descriptors to the guardian at the other end of ``channel``."""

    def __init__(self, channel: socket.socket) -> None:
        self._channel = channel
        self._ids = itertools.count()
        self._lock = threading.Lock()  # runtimes start in threads (asyncio.to_thread)

    def hold(self, fd: int, reap: tuple[str, str] | None = None) -> str:
        """Give the guardian a copy of ``fd`` (and, for a snapshot, its store and key, to remove
        it if no one holds it once the guardian lets go). Returns the id to ``drop`` it by."""
        ident = f"{os.getpid()}-{next(self._ids)}"
        words = ["hold", ident, *(reap or ())]
        with self._lock:
            self._channel.sendmsg(
                [" ".join(words).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd.to_bytes(4, sys.byteorder))]
            )
        return ident

    def drop(self, ident: str) -> None:
        """The guardian closes its copy; returns once it did, so the lock is ours alone again
        (idempotent: an unknown id is ignored there). A round trip of microseconds."""
        with self._lock:
            try:
                self._channel.send(f"drop {ident}".encode())
                self._channel.recv(16)
            except OSError:  # the guardian is gone: nothing is held there any more
                pass

    def close(self) -> None:
        """The guardian cleans up what is left and lets go of everything (the host shuts down)."""
        self._channel.close()


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """``(host end, guardian end)``: message boundaries kept, one message a lease."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
