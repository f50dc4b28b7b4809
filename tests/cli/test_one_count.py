"""Numbers a user can trust (issue 19 §1): every reader counts the same rows, a failure counts
the same in every figure, errors describe what is stored, a judge's failure is seen, and the
time figures say what they count. Real CLI processes."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rollout_ray import read_groups, read_run

ROOT = pathlib.Path(__file__).parents[2]
TASKSETS = ROOT / "tests" / "cli" / "tasksets"
ARITH = ROOT / "examples" / "arith.py"
from view_api import view_api  # noqa: E402 - beside this test: pytest puts its folder on sys.path

CLI = [sys.executable, "-m", "rollout_ray"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # each test runs two to four CLI processes


def _run(*argv: str | pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, argv)], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def duplicates_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, str, str, str]:
    """The duplicates taskset (3 tasks, two identical) × 2 samples: the run directory, eval's
    stdout and stderr, and report's stdout."""
    out = tmp_path_factory.mktemp("duplicates") / "run"
    result = _run("eval", TASKSETS / "duplicates.py", "--executor", "local", "--samples", "2", "--out", out)
    assert result.returncode == 0, result.stderr[-2000:]
    report = _run("report", out)
    assert report.returncode == 0, report.stderr[-2000:]
    return out, result.stdout, result.stderr, report.stdout


def test_identical_tasks_are_six_rows_in_three_groups_in_every_reader(
    duplicates_run: tuple[pathlib.Path, str, str, str],
) -> None:
    """3 tasks × 2 samples, two tasks identical: eval, report, the viewer and read_run agree."""
    out, stdout, stderr, report = duplicates_run
    assert "done 6/6" in stderr
    assert "rollouts 6  ok 6  failed 0  groups 3" in stdout.splitlines()
    assert report.splitlines()[0] == "rollouts 6  ok 6  failed 0  groups 3"

    runs, run, page = view_api(out, "api/runs", "api/run?run=run", "api/rollouts?run=run&limit=100")
    assert runs["runs"][0]["rollouts"] == 6
    assert (run["rollouts"], run["groups"]) == (6, 3)
    assert page["total"] == 6 and len({(r["group_id"], r["sample_idx"]) for r in page["rows"]}) == 6

    table = read_run(out)
    keys = list(zip(table["group_id"].to_pylist(), table["sample_idx"].to_pylist()))
    assert len(keys) == len(set(keys)) == 6
    assert len(set(table["group_id"].to_pylist())) == 3
    assert sorted(table["task_idx"].to_pylist()) == [0, 0, 1, 1, 2, 2]  # the position in the taskset
    assert table["data_idx"].to_pylist() == [0] * 6  # the task's own data, as given
    groups = read_groups(out)
    assert groups.num_rows == 3 and sorted(groups["group_id"].to_pylist()) == sorted(set(table["group_id"].to_pylist()))
    assert groups["n"].to_pylist() == [2, 2, 2]


def test_a_resume_over_a_changed_taskset_is_refused_in_one_line(tmp_path: pathlib.Path) -> None:
    taskset = tmp_path / "tasks.py"
    source = (TASKSETS / "duplicates.py").read_text()
    taskset.write_text(source)
    out = tmp_path / "run"
    flags = ("--executor", "local", "--samples", "2", "--out", out)
    assert _run("eval", taskset, *flags).returncode == 0
    taskset.write_text(source.replace('"What is 3 + 4?", "answer": "7"', '"What is 3 + 5?", "answer": "8"'))
    again = _run("eval", taskset, *flags, "--resume")
    assert again.returncode == 2, again.stderr[-2000:]
    (line,) = again.stderr.splitlines()[-1:]
    assert re.fullmatch(
        rf"rollout-ray eval: {re.escape(str(out))} was run with another taskset: task 2 is not the task stored "
        r"at that position \(group 2-[0-9a-f]{16}, now 2-[0-9a-f]{16}\); resume with the tasks it was run "
        r"with, in the same order, or start a new run in another directory",
        line,
    ), again.stderr
    assert "Traceback" not in again.stderr
    assert read_run(out, ["reward"]).num_rows == 6  # nothing written


def test_a_failure_counts_as_reward_zero_and_not_passing_in_every_figure(tmp_path: pathlib.Path) -> None:
    """The reward raises on half the tasks: mean reward and pass@1 agree, and the rule is said."""
    out = tmp_path / "run"
    result = _run("eval", TASKSETS / "half_raise.py", "--executor", "local", "--samples", "2", "--out", out)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "rollouts 8  ok 4  failed 4  groups 4"
    assert lines[1] == ("mean reward 0.5000  (failed rollouts count as reward 0 and not passing, here and in pass@k)")
    assert lines[2] == "pass@k  pass@1 0.5000  pass@2 0.5000"
    # The first message of each error type, one line under the counts.
    assert lines[lines.index("error types  TaskError=4") + 1] == (
        "  TaskError  first: task Add scoring failed: ValueError: no grader for 'What is 1 + 1?'"
    )
    table = read_run(out, ["ok", "reward", "advantage", "group_mean", "pass_at_1"])
    failed = [r for r in table.to_pylist() if not r["ok"]]
    assert len(failed) == 4 and {r["pass_at_1"] for r in failed} == {0.0}
    assert {(r["group_mean"], r["advantage"]) for r in failed} == {(0.0, 0.0)}
    assert _run("report", out).stdout.splitlines()[1:3] == lines[1:3]


class _Switchable(BaseHTTPRequestHandler):
    """An OpenAI-compatible model that refuses every call while ``down`` is set, else says 4."""

    down = threading.Event()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.down.is_set():
            status, body = 400, {"error": {"message": "model is down"}}
        else:
            status, body = (
                200,
                {
                    "id": "c",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "m",
                    "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "4"}}
                    ],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                },
            )
        self._send(status, json.dumps(body).encode())

    def do_GET(self) -> None:  # noqa: N802 - no /version, no /get_model_info: nothing to capture
        self._send(404, b'{"error": {"message": "not found"}}')

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def switchable_model() -> Iterator[tuple[str, threading.Event]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Switchable)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", _Switchable.down
    finally:
        _Switchable.down.clear()
        server.shutdown()
        server.server_close()
        thread.join()


def test_after_a_resume_errors_are_the_stored_outcomes_and_attempts_count_on(
    tmp_path: pathlib.Path, switchable_model: tuple[str, threading.Event]
) -> None:
    url, down = switchable_model
    out = tmp_path / "run"
    flags = (
        "--executor",
        "local",
        "--samples",
        "2",
        "--model-url",
        url,
        "--model",
        "m",
        "--retry-failed",
        "--retries",
        "1",
        "--out",
        out,
    )
    down.set()
    first = _run("eval", ARITH, "--limit", "3", *flags)
    assert first.returncode == 1, first.stderr[-2000:]  # every rollout failed
    assert "error types  ProviderError=6" in first.stdout
    down.clear()
    again = _run("eval", ARITH, "--limit", "3", *flags, "--resume")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "rollouts 6  ok 6  failed 0  groups 3" in again.stdout
    assert "error types  none" in again.stdout  # the stored outcomes, not the earlier attempts'
    rows = read_run(out, ["ok", "attempt", "error_type", "error_message", "num_errors", "attempts"]).to_pylist()
    for row in rows:
        assert (row["ok"], row["attempt"], row["error_type"], row["error_message"], row["num_errors"]) == (
            True,
            2,
            None,
            None,
            0,
        )
        assert [(a["attempt"], [e["type"] for e in a["errors"]]) for a in row["attempts"]] == [
            (0, ["ProviderError"]),
            (1, ["ProviderError"]),
            (2, []),
        ]
        assert "model is down" in row["attempts"][0]["errors"][0]["message"]


def test_the_judged_example_runs_and_a_broken_judge_is_seen_and_fails_the_exit(tmp_path: pathlib.Path) -> None:
    good = _run(
        "eval", ROOT / "examples" / "judged.py", "--executor", "local", "--limit", "3", "--out", tmp_path / "good"
    )
    assert good.returncode == 0, good.stderr[-2000:]
    assert "judge failed" not in good.stdout
    table = read_run(tmp_path / "good", ["group_id", "metric_majority", "reward_shortest"])
    assert table.num_rows == 12 and table["metric_majority"].null_count == 0
    assert sum(table["reward_shortest"].to_pylist()) >= 3  # at least one per group answered right
    bad = _run("eval", TASKSETS / "bad_judge.py", "--executor", "local", "--samples", "2", "--out", tmp_path / "bad")
    assert bad.returncode == 4, bad.stderr[-2000:]
    (line,) = [s for s in bad.stdout.splitlines() if s.startswith("judge failed")]
    assert re.fullmatch(
        r"judge failed on 3 of 3 groups  first: ValueError: judge result for group "
        r"'0-[0-9a-f]{16}': expected a mapping of column -> values or None, got list",
        line,
    )
    assert bad.stderr.splitlines()[-1].startswith("rollout-ray eval: the judge failed on 3 of 3 groups (")
    assert read_run(tmp_path / "bad", ["reward"]).num_rows == 6  # the rollouts are stored


def test_each_time_figure_says_what_it_counts_and_none_disagrees(
    duplicates_run: tuple[pathlib.Path, str, str, str],
) -> None:
    _, stdout, stderr, report_out = duplicates_run
    last = stdout.splitlines()[-2]
    match = re.fullmatch(
        r"wall ([\d.]+)s \(start ([\d.]+)s, rollouts ([\d.]+)s\)  ([\d.]+) rollouts/s over "
        r"the rollouts' ([\d.]+)s",
        last,
    )
    assert match, last
    wall, start, rollouts, rate, over = map(float, match.groups())
    # Each figure is printed rounded to 0.1 (an error up to 0.05 each): compare in whole tenths, as integers,
    # since float sums of printed tenths are not exact (0.5 + 0.3 > 0.7 + 0.1 in floating point).
    wall_t, start_t, rollouts_t = (round(x * 10) for x in (wall, start, rollouts))
    assert start_t + rollouts_t <= wall_t + 1 and over == rollouts
    # 6 rollouts over it: the rollouts' time is within 0.05 of its figure, the rate within 0.05 of its own.
    assert 6 / (rollouts + 0.05) - 0.05 <= rate <= 6 / max(rollouts - 0.05, 1e-3) + 0.05
    # The progress line's wall is the same clock: it never runs ahead of the summary's.
    progress = [s for s in stderr.splitlines() if s.startswith("done 6/6")][-1]
    assert int(re.search(r"  wall (\d+)s  ", progress).group(1)) <= wall  # type: ignore[union-attr]
    report = report_out.splitlines()
    assert not any(s.startswith("wall") for s in report)
    assert re.fullmatch(
        r"rollouts' span [\d.]+s \(first start to last end, from the stored spans\)  "
        r"[\d.]+ rollouts/s over it",
        report[-2],
    ), report[-2]


def test_groups_a_keep_rule_refused_are_named_in_the_header_summary_and_progress(tmp_path: pathlib.Path) -> None:
    """max_groups=3 from 8 tasks, odd tasks refused: 5 groups run and stored, 2 not streamed."""
    result = _run("eval", TASKSETS / "keep_rule.py", "--executor", "local", "--samples", "2", "--out", tmp_path / "r")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "3 groups from 8 tasks (max_groups) × 2 samples" in result.stderr.splitlines()[0]
    assert result.stderr.splitlines()[-1].startswith("done 10  failed 0  in flight 0")
    lines = result.stdout.splitlines()
    assert lines[0] == "rollouts 10  ok 10  failed 0  groups 5"
    assert "groups not streamed  keep_group=2  (stored, and counted above)" in lines
    assert read_run(tmp_path / "r", ["task_idx"]).num_rows == 10
