"""``rollout-ray ctl`` on a real CLI run on Ray: an eval on the session's Ray, its model calls
held at a barrier model server until the test releases them, steered by real ``ctl``
processes: status, cancel, set max-in-flight, stop, then the printed resume command."""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rollout_ray import read_run

ROOT = pathlib.Path(__file__).parents[2]
ARITH = str(ROOT / "examples" / "arith.py")
CLI = [sys.executable, "-m", "rollout_ray"]
BOUND = 90.0
"""Seconds a condition has to come true on a loaded machine (polls return as soon as it does)."""


class _Barrier(BaseHTTPRequestHandler):
    """An OpenAI chat endpoint that holds every call until ``release`` is set."""

    release = threading.Event()
    arrived = 0
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.lock:
            type(self).arrived += 1
        self.release.wait(BOUND)
        body = json.dumps(
            {
                "id": "c",
                "object": "chat.completion",
                "model": "barrier",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "0"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        ).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the caller left (a cancelled rollout)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def barrier() -> Iterator[tuple[str, type[_Barrier]]]:
    handler = type("Barrier", (_Barrier,), {"release": threading.Event(), "arrived": 0, "lock": threading.Lock()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", handler
    finally:
        handler.release.set()
        server.shutdown()
        server.server_close()
        thread.join()


def ctl(run_dir: pathlib.Path, *argv: str) -> str:
    done = subprocess.run([*CLI, "ctl", str(run_dir), *argv], capture_output=True, text=True, timeout=BOUND)
    assert done.returncode == 0, done.stderr
    return done.stdout


def until_status(run_dir: pathlib.Path, ok: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + BOUND
    while True:
        if (run_dir / "control.json").exists():
            status = json.loads(ctl(run_dir, "status", "--json"))
            if ok(status):
                return status
        assert time.monotonic() < deadline, "the condition did not come true"
        time.sleep(0.2)  # between polls of a condition, not a wait for an event


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(300)
def test_ctl_steers_a_cli_run_on_ray(
    ray_cluster: Any, tmp_path: pathlib.Path, barrier: tuple[str, type[_Barrier]]
) -> None:
    url, model = barrier
    out = tmp_path / "run"
    address = ray_cluster.get_runtime_context().gcs_address
    argv = [
        "eval",
        ARITH,
        "--address",
        address,
        "--actors",
        "2",
        "--limit",
        "6",
        "--samples",
        "1",
        "--max-in-flight",
        "2",
        "--model-url",
        url,
        "--model",
        "barrier",
        "--token-capture",
        "off",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen([*CLI, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        held = until_status(out, lambda s: s["phases"]["model call"] == 2)
        text = ctl(out, "status", "--stall-after", "0")
        assert held["progress"]["in_flight"] == 2 and held["servers"][0]["in_flight"] == 2
        for r in held["rollouts"]:  # named with task and rollout id, marked stalled past the bound
            assert re.search(rf"^STALLED +{r['id']} +{re.escape(r['label'])} +{r['task']}  model call ", text, re.M)

        first = min(held["rollouts"], key=lambda r: r["task"])
        assert ctl(out, "cancel", first["id"]).strip() == f"cancel {first['id']}"
        until_status(
            out, lambda s: first["label"] not in {r["label"] for r in s["rollouts"]} and s["phases"]["model call"] == 2
        )

        assert ctl(out, "set", "max-in-flight", "4").strip() == "max-in-flight 4"
        wider = until_status(out, lambda s: s["phases"]["model call"] == 4)
        assert wider["max_in_flight"] == 4 and model.arrived == 5

        assert ctl(out, "stop").strip() == "stop"
        assert until_status(out, lambda s: True)["state"] == "stopping"
        model.release.set()
        stdout, stderr = proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 3, stderr[-3000:]
    (line,) = [s for s in stderr.splitlines() if "run halted: stopped by the operator" in s]
    command = shlex.split(line.split("continue with: ", 1)[1])
    assert command[:2] == ["rollout-ray", "eval"] and command[-3:] == ["--resume", "--out", str(out)]
    assert len(read_run(str(out), ["task_idx"])) == 5  # the cancelled one and the four in flight
    assert json.loads((out / "status.json").read_text())["state"] == "halted"

    again = subprocess.run([*CLI, *command[1:]], capture_output=True, text=True, timeout=BOUND)
    assert again.returncode == 0, again.stderr[-3000:]
    rows = read_run(str(out), ["task_idx", "ok", "error_type"]).to_pylist()
    assert sorted(r["task_idx"] for r in rows) == list(range(6))
    assert [r["error_type"] for r in rows if not r["ok"]] == ["RolloutCancelled"]


def test_a_control_json_planted_as_a_link_is_not_read(tmp_path: pathlib.Path) -> None:
    """Someone who can write the run directory links control.json to a file of theirs: ctl
    would send its request (and the operator's intent) where that file points."""
    run, theirs = tmp_path / "run", tmp_path / "theirs.json"
    run.mkdir()
    theirs.write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "x"}))
    (run / "control.json").symlink_to(theirs)
    done = subprocess.run([*CLI, "ctl", str(run), "status"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "cannot read its control.json" in done.stderr and "symbolic link" in done.stderr
