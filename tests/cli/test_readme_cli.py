"""The command line as the README and docs/cli.md show it stays true: the flag table names
every eval flag, the pandas / polars / duckdb lines run over a real run directory, and the
commands run from a shell with nothing set up but what the quickstart does. Each block is found
by its mark (``<!-- runs: ... -->``, tests/doc_pages.py), on whichever page it moved to."""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from doc_pages import block_run_by, text

from rollout_ray._cli import main as cli
from rollout_ray._record.store import read_run

ROOT = pathlib.Path(__file__).parents[2]
HERE = "tests/cli/test_readme_cli.py::"
DATAFRAMES = HERE + "test_the_dataframe_lines_run_over_a_run_directory"


def test_the_flag_table_names_every_eval_flag() -> None:
    eval_parser = cli.parser()._subparsers._group_actions[0].choices["eval"]  # type: ignore[union-attr]
    flags = {s for a in eval_parser._actions for s in a.option_strings if s.startswith("--")} - {"--help"}
    cli_page = text("docs/cli.md")
    table = cli_page[cli_page.index("| `rollout-ray eval TASKSET` flag") :]
    table = table[: table.index("\n\n")]
    assert sorted(f for f in flags if f"`{f}" not in table) == []


def test_the_dataframe_lines_run_over_a_run_directory(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("pandas", "polars", "duckdb"):
        pytest.importorskip(name)
    out = str(tmp_path / "calc")
    code = cli.main(
        [
            "eval",
            str(ROOT / "examples" / "arith.py"),
            "--executor",
            "local",
            "--sim-ttft",
            "0",
            "--limit",
            "3",
            "--samples",
            "4",
            "--temperature",
            "1",
            "--out",
            out,
        ]
    )
    assert code == 0, capsys.readouterr().err
    lines = block_run_by(DATAFRAMES).replace('"runs/calc"', repr(out)).splitlines()
    scope: dict[str, object] = {}
    exec("\n".join(lines[:3]), scope)
    pandas_, polars_, duckdb_ = (eval(line.split("  #")[0], scope) for line in lines[3:6])
    assert list(pandas_.columns) == ["reward", "advantage"] and len(pandas_) == 3
    assert polars_.columns == ["rollout_id", "advantage", "messages"] and len(polars_) > 0
    assert (polars_["advantage"] > 0).all()
    assert len(duckdb_) == 3 and all(len(row) == 3 for row in duckdb_)


# -- the README's and docs' commands, from a shell with nothing set up ----------------------------------


def _bare_shell(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict[str, str]]:
    """A directory as a fresh clone has it after the install step, and the environment of a
    new login with nothing activated: ``env -i`` plus a system ``PATH`` and an empty home.

    The install steps themselves (``python3 -m venv .venv``, ``pip install -e '.[cli]'``) are not
    rerun: they take minutes and would reinstall the package into the venv running this
    suite. ``.venv`` is a link to that venv, which holds what they install; what runs for
    real is everything after them, found by name once the venv is activated."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the suite does not run in a virtual environment: no .venv to activate")
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "examples", clone / "examples")
    (clone / ".venv").symlink_to(sys.prefix)
    (tmp_path / "home").mkdir()
    return clone, {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home")}


def _steps(line: str) -> list[str]:
    return [step.strip() for step in line.split("#")[0].split("&&")]


def _bash(script: str, cwd: pathlib.Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    bare = "if command -v rollout-ray; then echo 'not a bare shell' >&2; exit 99; fi\n"
    return subprocess.run(
        ["/bin/bash", "-c", bare + script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
@pytest.mark.timeout(600)  # 27-35 s under load; its commands are bounded at 300 s each
def test_the_quickstart_runs_from_a_bare_shell(tmp_path: pathlib.Path) -> None:
    """The README's first command, as written after its install steps (see ``_bare_shell``):
    activate, then the main job on a private local Ray against the simulated model."""
    first = block_run_by("tests/test_readme.py::test_readme_starts_with_the_two_commands_and_ci_runs_the_second")
    first = first.splitlines()[0]
    steps = _steps(first)
    assert steps[:3] == ["python3 -m venv .venv", "source .venv/bin/activate", "pip install -e '.[cli]'"]
    clone, env = _bare_shell(tmp_path)
    result = _bash(" && ".join(steps[1:2] + steps[3:]), clone, env)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (clone / "runs").iterdir()
    rows = read_run(str(run_dir), ["ok"]).column("ok").to_pylist()
    assert len(rows) == 200 and all(rows)  # 50 tasks × 4 samples, every one stored ok
    assert "token data: stored for 200 of 200 rollouts (vllm)" in result.stdout  # asked in the actors' processes


def _pass_at(summary: str) -> dict[int, float]:
    return {int(k): float(v) for k, v in re.findall(r"pass@(\d+) ([0-9.]+)", summary)}


@pytest.mark.slow
@pytest.mark.timeout(600)  # 27-35 s under load; its commands are bounded at 300 s each
def test_the_command_line_showcase_runs_from_a_bare_shell(tmp_path: pathlib.Path) -> None:
    """The three commands under "The command line" and the dataframe lines, in a new shell
    after ``source .venv/bin/activate``. ``eval`` gets ``--executor local`` (the Ray path is
    the quickstart's, above: a second private Ray would cost its start again) and ``view``
    ``--port 0``. At temperature 0.7 the simulated model misreads the calculator now and
    then: pass@k rises with k, and the polars filter finds rollouts above their group's mean."""
    block = block_run_by(HERE + "test_the_command_line_showcase_runs_from_a_bare_shell")
    evaluate, report, view = (_steps(line)[0] for line in block.strip().splitlines())
    assert (evaluate.split()[:3], report, view) == (
        ["rollout-ray", "eval", "examples/calc_tool.py"],
        "rollout-ray report runs/calc",
        "rollout-ray view runs/",
    )
    clone, env = _bare_shell(tmp_path)
    lines = block_run_by(DATAFRAMES).splitlines()
    (clone / "frames.py").write_text(
        "\n".join(lines[:3] + [f"print(len({line.split('  #')[0]}))" for line in lines[3:6]])
    )
    script = f"source .venv/bin/activate && {evaluate} --executor local && {report} && python frames.py"
    result = _bash(script, clone, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (clone / "runs" / "calc" / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pass_at = _pass_at(result.stdout.split("rollouts 400")[-1])  # the report's summary
    assert sorted(pass_at) == [1, 2, 4, 8] and pass_at[1] < 0.9 and pass_at[1] < pass_at[4] <= pass_at[8]
    groups, above_mean, answers = map(int, result.stdout.strip().splitlines()[-3:])
    assert groups == 50 and 0 < above_mean < 400 and 0 < answers <= 50  # two tasks may share an answer
    proc = subprocess.Popen(
        ["/bin/bash", "-c", f"source .venv/bin/activate && exec {view} --port 0"],
        cwd=clone,
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("viewing 1 run(s) at http://127.0.0.1:"), line + proc.stderr.read()  # type: ignore[union-attr]
        with urllib.request.urlopen(line.split(" at ", 1)[1].split()[0] + "api/runs", timeout=30) as response:
            assert json.load(response)["runs"][0]["rollouts"] == 400
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_ctl_example_runs_long_enough_to_steer_with_every_command(tmp_path: pathlib.Path) -> None:
    """The ctl block (docs/operations.md), in order, on its eval (here on the local executor, in tmp_path):
    the run must still be live at its last command (it ended about 1 s after its warm-up)."""
    block = block_run_by(HERE + "test_the_ctl_example_runs_long_enough_to_steer_with_every_command")
    lines = [shlex.split(line.split("#")[0].rstrip().rstrip("&")) for line in block.strip().splitlines()]
    out = str(tmp_path / "long")
    run, steps = [out if a == "runs/long" else a for a in lines[0]], lines[1:]
    assert run[:2] == ["rollout-ray", "eval"] and all(s[:3] == ["rollout-ray", "ctl", "runs/long"] for s in steps)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollout_ray", *run[1:], "--executor", "local"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "long" / "control.json").exists():  # a bounded poll for the endpoint
            assert proc.poll() is None and time.monotonic() < deadline, "the run never opened its endpoint"
            time.sleep(0.2)
        for step in steps:
            argv = [out if a == "runs/long" else a for a in step[1:]]
            if argv[2] == "cancel":  # the README's id is an example: one of the run's own, the youngest
                _cancel_one(argv, deadline)
                continue
            _ctl(argv)
            if argv[2] == "pause":  # "then: resume"
                _ctl(argv[:2] + ["resume"])
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, stderr[-2000:]  # stopped by the operator: halted, with its resume line
    assert "run halted: stopped by the operator (rollout-ray ctl stop); continue with: " in stderr


def _cancel_one(argv: list[str], deadline: float) -> None:
    """``ctl RUN cancel ID`` of a rollout status lists; again with a fresh one if it finished
    in between (a ctl process takes seconds to start on a loaded machine)."""
    while True:
        status = json.loads(_ctl(argv[:2] + ["status", "--json"]))
        youngest = min(status["rollouts"], key=lambda r: r["age"])
        done = subprocess.run(
            [sys.executable, "-m", "rollout_ray", *argv[:3], youngest["id"]], capture_output=True, text=True, timeout=90
        )
        if done.returncode == 0:
            return
        assert "in flight" in done.stderr and time.monotonic() < deadline, done.stderr


def _ctl(argv: list[str]) -> str:
    done = subprocess.run([sys.executable, "-m", "rollout_ray", *argv], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, f"{argv}: {done.stderr}"
    return done.stdout
