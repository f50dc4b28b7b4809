"""eval's bad values and bad tasksets: one line in argparse's style, exit 2, nothing started."""

from __future__ import annotations

import pathlib

import pytest

from rollout_ray._cli import main as cli

TASKSETS = pathlib.Path(__file__).parent / "tasksets"
ARITH = str(pathlib.Path(__file__).parents[2] / "examples" / "arith.py")


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(list(argv))
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err  # one line: no usage block, no traceback
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--samples", "0"], "argument --samples: must be >= 1, got 0"),
        (
            ["--max-in-flight", "-1"],
            "argument --max-in-flight: must be >= 1, got -1 (or 'auto': as many as keep the model's servers saturated)",
        ),
        (["--limit", "-5"], "argument --limit: must be >= 1, got -5"),
        (["--limit", "0"], "argument --limit: must be >= 1, got 0"),
        (["--max-turns", "-1"], "argument --max-turns: must be >= 0, got -1"),
        (["--samples", "two"], "argument --samples: must be an integer, got 'two'"),
        (["--temperature", "-0.5"], "argument --temperature: must be >= 0, got -0.5"),
        (["--top-p", "1.5"], "argument --top-p: must be <= 1, got 1.5"),
        (["--timeout-agent", "0"], "argument --timeout-agent: must be > 0, got 0"),
        (["--max-tokens-total", "-3"], "argument --max-tokens-total: must be >= 0, got -3"),
        (["--pass-k", "1,x"], "argument --pass-k: must be comma-separated integers such as 1,4,8, got '1,x'"),
        (["--pass-k", "0,4"], "argument --pass-k: must be integers >= 1 such as 1,4,8, got '0,4'"),
        (
            ["--sampling", "[1]"],
            "argument --sampling: must be a JSON object such as '{\"temperature\": 0.7}', got '[1]'",
        ),
        (["--retries", "-1"], "argument --retries: must be >= 0, got -1"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, argv: list[str], message: str
) -> None:
    out = tmp_path / "run"
    assert _error(capsys, "eval", ARITH, "--out", str(out), *argv) == f"rollout-ray eval: error: {message}"
    assert not out.exists()


@pytest.mark.parametrize(
    ("taskset", "message"),
    [
        ("dict_tasks.py", "tasks() of {path} must yield Task objects (e.g. MyTask({{...}})), but item 0 is a dict"),
        ("empty.py", "tasks() of {path} yielded no tasks; it must yield Task objects"),
        ("missing.py", "no such file: {path}"),
    ],
)
def test_a_bad_taskset_is_one_line_before_ray_starts_or_a_file_is_written(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, taskset: str, message: str
) -> None:
    path, out = str(TASKSETS / taskset), tmp_path / "run"
    line = _error(capsys, "eval", path, "--out", str(out))  # the default executor is Ray
    assert line == "rollout-ray eval: error: " + message.format(path=path)
    assert not out.exists()


def test_a_number_that_is_not_finite_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    line = _error(capsys, "eval", ARITH, "--out", str(tmp_path / "run"), "--timeout-setup", "1e400")
    assert line == "rollout-ray eval: error: argument --timeout-setup: must be a finite number, got 1e400"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--version"], ["eval", "--version"]):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        assert exit_info.value.code == 0
        assert capsys.readouterr().out.strip() == f"rollout-ray {cli.version()}"


def test_resume_without_out_and_no_run_lists_what_is_there(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    line = _error(capsys, "eval", ARITH, "--resume")
    assert line == (
        f"rollout-ray eval: error: --resume without --out: no run of {ARITH} under runs/ "
        "(runs there: none); pass --out RUN_DIR"
    )
