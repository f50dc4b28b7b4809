"""eval's exit: codes, the interrupt line (SIGINT, SIGTERM) and its continue command, resume of
the latest run, report on what is not a run or into a closed pipe. Real CLI processes."""

from __future__ import annotations

import os
import pathlib
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rollout_ray import read_run

ROOT = pathlib.Path(__file__).parents[2]
ARITH = str(ROOT / "examples" / "arith.py")
FAILING = str(ROOT / "tests" / "cli" / "tasksets" / "failing_setup.py")
CLI = [sys.executable, "-m", "rollout_ray"]


def _run(*argv: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=120, cwd=cwd)


def _interrupt(signum: int, argv: list[str]) -> tuple[int, str]:
    """Start an eval, signal it once its first rollout is done; its code and stderr."""
    proc = subprocess.Popen([*CLI, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    assert proc.stderr is not None
    for line in proc.stderr:  # waits on output, not on time
        seen.append(line)
        if line.startswith("done "):
            break
    proc.send_signal(signum)
    rest, err = proc.communicate(timeout=60)
    return proc.returncode, "".join(seen) + err


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_with_one_line_that_says_how_to_continue(tmp_path: pathlib.Path, signum: int, code: int) -> None:
    """Two CLI processes: the interrupted run, and the printed command that continues it."""
    out = str(tmp_path / "run")
    returncode, stderr = _interrupt(
        signum,
        [
            "eval",
            ARITH,
            "--executor",
            "local",
            "--limit",
            "10",
            "--samples",
            "2",
            "--max-in-flight",
            "2",
            "--sim-ttft",
            "0.2",
            "--out",
            out,
            "--seed",
            "1",
        ],
    )
    assert returncode == code, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    (line,) = [s for s in stderr.splitlines() if s.startswith("interrupted")]
    stored, total, command = _parse(line)
    assert total == 20 and stored == len(read_run(out, ["reward"]))
    assert command == [
        "rollout-ray",
        "eval",
        ARITH,
        "--executor",
        "local",
        "--limit",
        "10",
        "--samples",
        "2",
        "--max-in-flight",
        "2",
        "--sim-ttft",
        "0.2",
        "--seed",
        "1",
        "--resume",
        "--out",
        out,
    ]
    again = _run(*command[1:])  # the printed command, as given
    assert again.returncode == 0, again.stderr[-2000:]
    assert "rollouts 20  ok 20  failed 0  groups 10" in again.stdout
    table = read_run(out, ["group_id", "sample_idx"])
    assert len(set(zip(table["group_id"].to_pylist(), table["sample_idx"].to_pylist()))) == 20


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_on_ray_is_the_same_line_with_no_stack_dump_and_a_quiet_start(tmp_path: pathlib.Path) -> None:
    """Starts its own private Ray: no token-auth WARNING, a warmup line, then SIGTERM."""
    out = str(tmp_path / "run")
    returncode, stderr = _interrupt(
        signal.SIGTERM,
        ["eval", ARITH, "--limit", "10", "--samples", "2", "--max-in-flight", "2", "--sim-ttft", "0.2", "--out", out],
    )
    assert returncode == 143, stderr
    assert "Token authentication is enabled" not in stderr
    assert [s for s in stderr.splitlines() if s.startswith("warmup ")], stderr
    assert "Traceback" not in stderr and "SIGTERM" not in stderr and "*** " not in stderr, stderr
    (line,) = [s for s in stderr.splitlines() if s.startswith("interrupted")]
    assert _parse(line)[1] == 20


UNFINISHED = " (finished samples of groups not yet complete are not stored: the resume runs them again)"
"""Why the progress bar's count can exceed the stored one (issue 28: 88 vs 80)."""


def _parse(line: str) -> tuple[int, int, list[str]]:
    head, command = line.split("; continue with: ")
    assert head.endswith(" stored" + UNFINISHED), head  # groups of 2 samples: some may be half done
    stored, total = head.removeprefix("interrupted: ").removesuffix(" stored" + UNFINISHED).split(" of ")
    return int(stored), int(total), shlex.split(command)


def test_the_continue_command_keeps_the_flags_and_drops_the_old_out() -> None:
    from rollout_ray._cli.runs import continue_command

    argv = ["eval", "a b.py", "--out=old", "--samples", "2", "--resume", "--out", "older"]
    assert continue_command(argv, "new dir") == "rollout-ray eval 'a b.py' --samples 2 --resume --out 'new dir'"
    # A run started with --overwrite continues with --resume only (the two exclude each other).
    started = ["eval", "t.py", "--overwrite", "--out", "r"]
    assert continue_command(started, "r") == "rollout-ray eval t.py --resume --out r"


def test_every_rollout_failed_is_a_failure(tmp_path: pathlib.Path) -> None:
    result = _run("eval", FAILING, "--executor", "local", "--samples", "2", "--out", str(tmp_path / "run"))
    assert result.returncode == 1, result.stderr[-2000:]
    assert "rollouts 4  ok 0  failed 4" in result.stdout
    assert result.stderr.splitlines()[-1] == (
        "rollout-ray eval: every rollout failed (4 of 4); see the error types above, or `rollout-ray view` the run"
    )


class _Refusing(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b'{"error": {"message": "no"}}'
        self.send_response(400)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def refusing_model() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_breaker_halt_has_its_own_code_and_its_reason_first(tmp_path: pathlib.Path, refusing_model: str) -> None:
    out = str(tmp_path / "run")
    argv = [
        "eval",
        ARITH,
        "--executor",
        "local",
        "--limit",
        "3",
        "--samples",
        "4",
        "--model-url",
        refusing_model,
        "--model",
        "m",
        "--out",
        out,
    ]
    result = _run(*argv)
    assert result.returncode == 3, result.stderr[-2000:]
    first = result.stdout.splitlines()[0]
    assert first.startswith("halted: circuit breaker: 10 consecutive provider failures"), result.stdout
    last = result.stderr.splitlines()[-1]  # as after Ctrl-C: the command that continues the run
    halted, command = last.split("; continue with: ")
    assert halted.startswith("rollout-ray eval: run halted: circuit breaker: 10 consecutive provider failures")
    assert shlex.split(command) == ["rollout-ray", *argv[:-2], "--resume", "--out", out]


def test_resume_without_out_takes_the_latest_run_of_the_taskset(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollout_ray._cli import main as cli

    monkeypatch.chdir(tmp_path)
    argv = ["eval", ARITH, "--executor", "local", "--limit", "2", "--sim-ttft", "0"]
    assert cli.main(argv) == 0
    (run,) = os.listdir(tmp_path / "runs")
    capsys.readouterr()
    assert cli.main([*argv, "--resume"]) == 0
    again = capsys.readouterr()
    assert f"resuming runs/{run}" in again.err.splitlines()
    assert "rollouts 8  ok 8" in again.out and "done 0/0" in again.err  # nothing rerun
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["eval", FAILING, "--executor", "local", "--resume"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"rollout-ray eval: error: --resume without --out: no run of {FAILING} "
        f"under runs/ (runs there: {run} ({ARITH})); pass --out RUN_DIR\n"
    )


def test_report_on_a_directory_that_is_not_a_run(tmp_path: pathlib.Path) -> None:
    result = _run("report", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr == (
        f"rollout-ray report: error: {tmp_path} is not a run directory (no manifest.json, "
        "no shards); `rollout-ray eval TASKSET --out DIR` writes one\n"
    )


def test_report_on_a_missing_directory(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rollout_ray._cli import main as cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["report", str(tmp_path / "nope")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"rollout-ray report: error: no such run directory: {tmp_path / 'nope'}\n"


def test_report_into_a_closed_pipe_is_quiet(tmp_path: pathlib.Path) -> None:
    from rollout_ray._cli import main as cli

    out = str(tmp_path / "run")
    assert cli.main(["eval", ARITH, "--executor", "local", "--limit", "1", "--sim-ttft", "0", "--out", out]) == 0
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before a line is written: `report | head` at its worst
    try:
        proc = subprocess.run([*CLI, "report", out], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 141
    assert proc.stderr == ""
