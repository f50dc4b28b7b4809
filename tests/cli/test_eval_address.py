"""``--address`` where something listens that is not Ray (issue 28): one line naming what
answered, exit 2, within seconds; Ctrl-C while it is asked ends eval at once. ``ray.init``
waited forever on an HTTP server's port (Ctrl-C did nothing) and failed after ~20 s with a long
traceback elsewhere. Real CLI processes against loopback servers the tests start."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

ROOT = pathlib.Path(__file__).parents[2]
ARITH = str(ROOT / "examples" / "arith.py")
CLI = [sys.executable, "-m", "rollout_ray"]

pytestmark = pytest.mark.timeout(120)


def _eval(tmp_path: pathlib.Path, port: int) -> subprocess.Popen[str]:
    """eval joining 127.0.0.1:``port``, with a Ray temp dir of its own (so a Ray that starts shows)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = str(tmp_path / "ray-tmp")
    return subprocess.Popen(
        [*CLI, "eval", ARITH, "--address", f"127.0.0.1:{port}", "--out", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # Ctrl-C as a terminal gives it: a suite started in the background of a script (`cmd &`
        # in a non-interactive shell) hands its children SIGINT ignored, and eval rightly keeps
        # an ignored SIGINT ignored.
        preexec_fn=_sigint_default,
    )


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _refused_line(tmp_path: pathlib.Path, port: int) -> str:
    proc = _eval(tmp_path, port)
    stdout, stderr = proc.communicate(timeout=60)  # a hang guard: before the fix, forever
    assert proc.returncode == 2, stderr[-3000:]
    assert stdout == "" and len(stderr.splitlines()) == 1, stderr[-3000:]  # no header, no Ray log, no traceback
    assert not (tmp_path / "ray-tmp").exists()  # ray.init never ran
    return stderr.strip()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port whose connections the kernel accepts (listening, never accepted) and
    nothing ever answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_port_that_accepts_and_never_answers_is_one_line(tmp_path: pathlib.Path, silent_port: int) -> None:
    line = _refused_line(tmp_path, silent_port)
    assert line == (
        f"rollout-ray eval: cannot reach Ray at 127.0.0.1:{silent_port} (something accepts connections "
        "there but did not answer a gRPC hello within 5s: not a Ray cluster); check --address"
    )


def test_an_http_server_is_named_in_one_line(tmp_path: pathlib.Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        line = _refused_line(tmp_path, port)
    finally:
        server.shutdown()
        server.server_close()
    # http.server answers a request in HTTP/2 as HTTP/0.9 did: a bare error page, no status line.
    assert line == (
        f"rollout-ray eval: cannot reach Ray at 127.0.0.1:{port} (an HTTP server answered an HTML page "
        "('Error response'): not a Ray cluster); check --address"
    )


def test_ctrl_c_while_a_silent_server_is_asked_ends_eval_at_once(tmp_path: pathlib.Path) -> None:
    """The server accepts and reads eval's hello, then never answers; SIGINT then ends eval
    with one line and 130, long before the answer's 5 s bound would."""
    heard = threading.Event()
    held: list[socket.socket] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)

        def accept() -> None:
            conn, _ = listener.accept()
            held.append(conn)
            if conn.recv(64):
                heard.set()

        threading.Thread(target=accept, daemon=True).start()
        proc = _eval(tmp_path, int(listener.getsockname()[1]))
        try:
            assert heard.wait(60), "eval never sent its hello"
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)  # a hang guard
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
            for conn in held:
                conn.close()
    assert proc.returncode == 130, stderr[-3000:]
    assert stderr.strip() == "rollout-ray eval: interrupted", stderr[-3000:]
