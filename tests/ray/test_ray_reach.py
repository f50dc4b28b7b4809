"""Joining Ray at an address nothing answers at fails at once, in one line, before ``ray.init``
(which would retry for ~40 s, printing C++ warnings); a live cluster's address passes."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("ray")

from rollout_ray._errors import RayUnreachable
from rollout_ray._ray.head import check_reachable, init_ray


@contextlib.contextmanager
def _refused_port() -> Iterator[int]:
    """A port that refuses connections while the block runs: bound, not listening, so no other
    process's server can take it meanwhile (as it could take a port closed and handed on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_an_address_nothing_listens_at_is_refused_before_ray_init(scheme: str) -> None:
    with _refused_port() as port:
        address = f"{scheme}127.0.0.1:{port}"
        started = time.monotonic()
        with pytest.raises(RayUnreachable, match=rf"^cannot reach Ray at {address} \(Connection refused\)$") as info:
            init_ray(address)
    assert time.monotonic() - started < 30  # a hang guard: Ray's own retries would take ~40 s
    assert info.value.address == address


@pytest.mark.ray
def test_a_live_cluster_and_the_addresses_ray_resolves_pass(ray_cluster: Any) -> None:
    check_reachable(ray_cluster.get_runtime_context().gcs_address)
    for resolved_by_ray in ("auto", "local"):
        check_reachable(resolved_by_ray)


def _answering(answer: bytes) -> tuple[socket.socket, threading.Thread]:
    """A loopback server that reads a connection's first bytes, writes ``answer`` and closes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(64)
            conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (
            b"HTTP/1.1 400 Bad Request\r\nServer: uvicorn\r\ncontent-length: 0\r\n\r\n",
            "an HTTP server (uvicorn) answered 'HTTP/1.1 400 Bad Request'",
        ),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "something answered that is not gRPC (b'SSH-2.0-OpenSSH_9.6\\r\\n')"),
        (b"", "something accepts connections there but closed at a gRPC hello"),
    ],
)
def test_something_that_answers_but_is_not_ray_is_named(answer: bytes, says: str) -> None:
    """Issue 28: a TCP connection is not enough; Ray's GCS answers HTTP/2 (gRPC)."""
    listener, thread = _answering(answer)
    with listener:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(RayUnreachable) as info:
            check_reachable(address, timeout=30)  # a hang guard: each answers at once
        thread.join(30)
    assert str(info.value) == f"cannot reach Ray at {address} ({says}: not a Ray cluster)"


def test_a_port_that_accepts_and_never_answers_is_refused_within_the_timeout() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)  # the kernel accepts; nothing reads or answers
        address = f"127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(RayUnreachable, match=r"did not answer a gRPC hello within 0\.5s: not a Ray cluster\)$"):
            check_reachable(address, timeout=0.5)


def test_ctrl_c_delivered_to_another_thread_ends_the_hello_wait_at_once() -> None:
    """SIGINT goes to any thread of the process (Ray's import starts several). The check used
    to block in one recv for its whole bound, which such a signal does not wake: under load
    eval answered Ctrl-C with the 5 s "did not answer" line and exit 2 instead of 130. The
    signal is sent here to a thread that is not the one waiting."""
    import signal

    heard = threading.Event()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        held: list[socket.socket] = []

        def serve_silently() -> None:
            conn, _ = s.accept()
            held.append(conn)
            if conn.recv(64):
                heard.set()

        def interrupt_from_here() -> None:
            assert heard.wait(60)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)

        threading.Thread(target=serve_silently, daemon=True).start()
        other = threading.Thread(target=interrupt_from_here, daemon=True)
        other.start()
        started = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt):
                check_reachable(f"127.0.0.1:{s.getsockname()[1]}", timeout=60)
        finally:
            other.join(60)
            for conn in held:
                conn.close()
    assert time.monotonic() - started < 30  # a hang guard: before, the wait ran to its 60 s bound
