"""The red team's planted links (issue 21 §1), against real CLI processes: a link someone else
plants in a run directory is refused by name in one line (exit 2), and the file it points to
keeps its content. The run directory itself may not be a link; the directories above it are
the user's choice."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_ray._record.store import read_manifest, read_run

pytestmark = pytest.mark.security

ROOT = Path(__file__).parents[2]
ARITH = str(ROOT / "examples" / "arith.py")
CLI = [sys.executable, "-m", "rollout_ray"]
PRECIOUS = "precious\n"
LINK = (
    "{path} is a symbolic link; a run directory and what it holds are never reached through one: remove the "
    "link, or pass the directory itself"
)

Report = Callable[[str, str, str, str, float], None]


def cli(cwd: Path, *argv: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    started = time.monotonic()
    done = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
    return done, time.monotonic() - started


def evaluate(cwd: Path, out: str, *flags: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The red team's command: ``rollout-ray eval examples/arith.py --executor local --limit 2 --out OUT``."""
    return cli(cwd, "eval", ARITH, "--executor", "local", "--limit", "2", "--out", out, *flags)


def refused(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused command ends with (no traceback)."""
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr.splitlines()[-1]


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run the red team's command wrote (copied by the tests that change it)."""
    cwd = tmp_path_factory.mktemp("stored")
    done, _ = evaluate(cwd, "r")
    assert done.returncode == 0, done.stderr[-3000:]
    return cwd / "r"


def outside_file(tmp_path: Path) -> Path:
    victim = tmp_path / "c"
    victim.write_text(PRECIOUS)
    return victim


@pytest.mark.parametrize(
    "planted", [".lock", "manifest.json.tmp", "shards/part-00000.parquet.tmp", "groups/part-00000.parquet.tmp"]
)
def test_a_link_planted_where_eval_writes_is_refused_and_the_outside_file_kept(
    tmp_path: Path, planted: str, report: Report
) -> None:
    victim = outside_file(tmp_path)
    (tmp_path / "r" / planted).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "r" / planted).symlink_to(victim)
    done, seconds = evaluate(tmp_path, "r")
    # The lock is taken with eval's checks, before Ray (``_cli/claim``): a check's "error:" line.
    kind = "error: " if planted == ".lock" else ""
    assert refused(done) == "rollout-ray eval: " + kind + LINK.format(path=f"r/{planted}")
    assert victim.read_text() == PRECIOUS and (tmp_path / "r" / planted).is_symlink()
    report(
        f"21§1 planted r/{planted}",
        "link to an outside file; eval --out r",
        "refused: exit 2, names it",
        "outside file intact",
        seconds,
    )


@pytest.mark.parametrize("planted", ["report.png", "report.png.tmp"])
def test_report_draws_its_plot_through_no_link(tmp_path: Path, stored: Path, planted: str, report: Report) -> None:
    pytest.importorskip("matplotlib")
    run = shutil.copytree(stored, tmp_path / "r", symlinks=True)
    victim = outside_file(tmp_path)
    (run / planted).symlink_to(victim)
    done, seconds = cli(tmp_path, "report", "r")
    assert refused(done) == "rollout-ray report: error: " + LINK.format(path=f"r/{planted}")
    assert victim.read_text() == PRECIOUS
    report(
        f"21§1 planted r/{planted}",
        "link to an outside file; report r",
        "refused: exit 2, names it",
        "outside file intact",
        seconds,
    )
    (run / planted).unlink()
    done, _ = cli(tmp_path, "report", "r")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run / "report.png").read_bytes().startswith(b"\x89PNG") and not (run / "report.png.tmp").exists()


def test_overwrite_removes_links_inside_and_follows_none(tmp_path: Path, stored: Path, report: Report) -> None:
    run = shutil.copytree(stored, tmp_path / "r", symlinks=True)
    victim = outside_file(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "keep").mkdir(parents=True)
    (run / "file-link").symlink_to(victim)
    (run / "dir-link").symlink_to(elsewhere, target_is_directory=True)
    (run / "shards" / "into").symlink_to(elsewhere, target_is_directory=True)
    first = read_manifest(run).run_id
    done, seconds = evaluate(tmp_path, "r", "--overwrite")
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_manifest(run).run_id != first and read_run(run).num_rows == 8
    assert sorted(os.listdir(run)) == [".lock", "groups", "manifest.json", "shards", "status.json"]
    assert victim.read_text() == PRECIOUS and os.listdir(elsewhere) == ["keep"]
    report(
        "21§1 --overwrite, links inside",
        "file, folder and shards/ links",
        "removed, never followed",
        "outside files intact",
        seconds,
    )


def test_a_run_directory_that_is_a_link_is_refused_by_every_command(
    tmp_path: Path, stored: Path, report: Report
) -> None:
    real = shutil.copytree(stored, tmp_path / "real", symlinks=True)
    (tmp_path / "r").symlink_to(real, target_is_directory=True)
    manifest = (real / "manifest.json").read_bytes()
    done, seconds = evaluate(tmp_path, "r", "--resume")
    assert refused(done) == (
        "rollout-ray eval: error: --out r is a symbolic link; a run directory is never "
        "reached through one: pass the directory itself"
    )
    done, _ = cli(tmp_path, "report", "r")
    assert refused(done) == "rollout-ray report: error: " + LINK.format(path="r")
    done, _ = cli(tmp_path, "view", "r", "--port", "0")
    assert refused(done) == "rollout-ray view: " + LINK.format(path="r")
    assert (real / "manifest.json").read_bytes() == manifest and not (real / "report.png").exists()
    report(
        "21§1 run dir is a link",
        "r -> a run; eval --resume, report, view",
        "each refused: exit 2",
        "the run untouched",
        seconds,
    )


def view_statuses(cwd: Path, root: str, *paths: str) -> list[tuple[int, Any]]:
    """GET each path from a real ``rollout-ray view ROOT`` process: (status, JSON body)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*CLI, "view", root, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert " at http://127.0.0.1:" in line, line
        url = line.split(" at ", 1)[1].split()[0]
        out: list[tuple[int, Any]] = []
        for path in paths:
            try:
                with urllib.request.urlopen(url + path, timeout=30) as response:
                    out.append((response.status, json.load(response)))
            except urllib.error.HTTPError as e:
                with e:
                    out.append((e.code, json.load(e)))
        return out
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_the_viewer_command_follows_no_link_out_of_its_root(tmp_path: Path, stored: Path, report: Report) -> None:
    shutil.copytree(stored, tmp_path / "root" / "mine", symlinks=True)
    theirs = shutil.copytree(stored, tmp_path / "private" / "theirs", symlinks=True)
    (tmp_path / "root" / "ext").symlink_to(theirs, target_is_directory=True)  # a run, linked in
    (tmp_path / "root" / "more").symlink_to(theirs.parent, target_is_directory=True)  # a folder of runs
    started = time.monotonic()
    (_, runs), *served = view_statuses(
        tmp_path,
        "root",
        "api/runs",
        "api/run?run=ext",
        "api/rollouts?run=ext",
        "api/rollouts?run=more/theirs",
        "api/rollouts?run=mine",
    )
    seconds = time.monotonic() - started
    assert [r["id"] for r in runs["runs"]] == ["mine"]
    assert [status for status, _ in served] == [404, 404, 404, 200] and len(served[-1][1]["rows"]) == 8
    report(
        "21§1 rollout-ray view: run linked in",
        "root/ext -> a run outside, root/more -> its folder",
        "neither listed nor served (404)",
        "0 rows of theirs served",
        seconds,
    )


def test_a_link_among_the_parents_is_the_users_choice(tmp_path: Path) -> None:
    (tmp_path / "disk").mkdir()
    (tmp_path / "runs").symlink_to(tmp_path / "disk", target_is_directory=True)
    done, _ = evaluate(tmp_path, "runs/r")
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_run(tmp_path / "disk" / "r").num_rows == 8


def test_the_red_teams_manifest_scenario_then_a_clean_run(tmp_path: Path, report: Any) -> None:
    """``mkdir r; echo precious > c; ln -s "$PWD/c" r/manifest.json.tmp; rollout-ray eval ...``"""
    (tmp_path / "r").mkdir()
    victim = outside_file(tmp_path)
    (tmp_path / "r" / "manifest.json.tmp").symlink_to(victim)
    done, _ = evaluate(tmp_path, "r")
    assert refused(done).endswith(
        "r/manifest.json.tmp is a symbolic link; a run directory and what it holds are "
        "never reached through one: remove the link, or pass the directory itself"
    )
    assert victim.read_text() == PRECIOUS and not (tmp_path / "r" / "manifest.json").exists()
    (tmp_path / "r" / "manifest.json.tmp").unlink()
    done, _ = evaluate(tmp_path, "r")
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_run(tmp_path / "r").num_rows == 8 and victim.read_text() == PRECIOUS


@pytest.mark.parametrize("planted", ["grid.toml", "comparison.parquet", "comparison.csv"])
def test_a_sweep_writes_its_own_files_through_no_link(tmp_path: Path, planted: str, report: Report) -> None:
    """A sweep's directory holds its points' run directories and is shared as they are."""
    grid = tmp_path / "grid.toml"
    grid.write_text(f'taskset = "{ARITH}"\n[base]\nsamples = 1\nlimit = 1\nexecutor = "local"\n')
    victim = outside_file(tmp_path)
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / planted).symlink_to(victim)
    done, seconds = cli(tmp_path, "sweep", str(grid), "--out", "s")
    assert refused(done) == "rollout-ray sweep: " + LINK.format(path=f"s/{planted}")
    assert victim.read_text() == PRECIOUS and (tmp_path / "s" / planted).is_symlink()
    report(
        f"21§1 planted s/{planted}",
        "link to an outside file; sweep --out s",
        "refused: exit 2, names it",
        "outside file intact",
        seconds,
    )
