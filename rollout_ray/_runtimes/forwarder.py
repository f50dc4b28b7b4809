"""The sandbox end of ``SandboxRuntime``'s allowed routes; runs as the program's parent.

Run as a plain script inside the sandbox's network namespace (standard library only, so
it starts fast)::

    python -I -S forwarder.py --route PORT=SOCKET ... -- PROGRAM ARGS...

It listens on ``127.0.0.1:PORT`` for every route *before* starting the program (so the
program never races the listeners), relays each connection to ``SOCKET`` (a unix socket
bind-mounted from the host, where the runtime relays it on to the real route), runs the
program with the forwarder's own standard streams, and exits as the program did: with its
exit code, or killed by the same signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading

CHUNK = 1 << 16


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until EOF or an error, then half-close ``dst``."""
    try:
        while data := src.recv(CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _relay(conn: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        upstream.close()
        conn.close()  # the program sees the connection reset, as from a dead server
        return
    back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
    back.start()
    _pump(conn, upstream)
    back.join()
    conn.close()
    upstream.close()


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_relay, args=(conn, path), daemon=True).start()


def parse(argv: list[str]) -> tuple[list[tuple[int, str]], list[str]]:
    """``(routes, program)`` from ``--route PORT=SOCKET ... -- PROGRAM ...``."""
    routes: list[tuple[int, str]] = []
    i = 0
    while i < len(argv) and argv[i] == "--route":
        port, _, path = argv[i + 1].partition("=")
        routes.append((int(port), path))
        i += 2
    if i >= len(argv) or argv[i] != "--" or i + 1 == len(argv):
        raise SystemExit("usage: forwarder.py [--route PORT=SOCKET]... -- PROGRAM [ARGS...]")
    return routes, argv[i + 1 :]


def main() -> None:
    routes, program = parse(sys.argv[1:])
    for port, path in routes:
        listener = socket.create_server(("127.0.0.1", port))
        threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    try:
        proc = subprocess.Popen(program)  # noqa: S603 - argv of our forwarder program, no shell
    except OSError as e:
        print(f"rollout-ray sandbox: cannot start {program[0]!r}: {e}", file=sys.stderr)
        sys.exit(127)
    code = proc.wait()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
