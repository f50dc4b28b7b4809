"""The viewer follows no link out of the directories it was given (issue 21 §1): a link to a run
elsewhere is neither listed nor served, a directory on the way to a run swapped for a link is
refused, and a link inside a run is an error naming it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from viewer_runs import get, serve_requests, write_run

from rollout_ray._viewer.catalog import NotARunDirectory
from rollout_ray._viewer.server import Viewer

pytestmark = pytest.mark.security

LINK = "is a symbolic link; a run directory and what it holds are never reached through one"


def test_a_link_to_a_run_outside_the_root_is_neither_listed_nor_served(tmp_path: Path, report: Any) -> None:
    root, outside = tmp_path / "root", tmp_path / "private"
    write_run(root / "mine", 4, run_id="mine")
    write_run(outside / "theirs", 4, run_id="theirs")
    (root / "ext").symlink_to(outside / "theirs", target_is_directory=True)
    (root / "more").symlink_to(outside, target_is_directory=True)  # a directory of runs, linked in
    started = time.monotonic()
    viewer = Viewer([root])
    assert [r["id"] for r in get(viewer, "/api/runs")["runs"]] == ["mine"]
    answers = serve_requests(viewer, "/api/run?run=ext", "/api/rollouts?run=ext", "/api/rollouts?run=more/theirs")
    assert [status for status, _ in answers] == [404, 404, 404]
    report(
        "21§1 viewer: link to a run outside its root",
        "root/ext -> another run, root/more -> its folder",
        "neither listed nor served (404)",
        "0 rows served",
        time.monotonic() - started,
    )


def test_a_directory_swapped_for_a_link_after_the_scan_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "private"
    write_run(root / "sweep" / "point", 4, run_id="mine")
    write_run(outside / "point", 8, run_id="theirs")
    viewer = Viewer([root])
    assert get(viewer, "/api/run", run="sweep/point")["rollouts"] == 4
    (root / "sweep").rename(tmp_path / "moved")
    (root / "sweep").symlink_to(outside, target_is_directory=True)
    ((status, body),) = serve_requests(viewer, "/api/rollouts?run=sweep/point")
    assert status == 500 and body["error"].startswith(f"{root / 'sweep'} {LINK}")


@pytest.mark.parametrize("planted", ["manifest.json", "shards", "shards/part-00001.parquet"])
def test_a_link_inside_a_run_is_an_error_naming_it(tmp_path: Path, planted: str) -> None:
    run, other = write_run(tmp_path / "run", 8, rows_per_shard=4), write_run(tmp_path / "other", 8, rows_per_shard=4)
    target = run / planted
    (other / planted).rename(tmp_path / "taken")
    target.rename(other / planted)
    target.symlink_to(other / planted, target_is_directory=planted == "shards")
    ((status, body),) = serve_requests(Viewer([run]), "/api/rollouts?run=run")
    assert status == 500 and body["error"].startswith(f"{target} {LINK}")


def test_a_run_directory_given_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(write_run(tmp_path / "run", 4), target_is_directory=True)
    with pytest.raises(NotARunDirectory, match=rf"^{tmp_path / 'link'} {LINK}"):
        Viewer([tmp_path / "link"])
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "link").symlink_to(tmp_path / "run", target_is_directory=True)
    with pytest.raises(NotARunDirectory, match="holds no runs"):
        Viewer([tmp_path / "runs"])


def test_a_status_json_link_is_not_read_the_run_is_not_live(tmp_path: Path) -> None:
    """A live run's status.json is read as the run's other files: through no link."""
    run = write_run(tmp_path / "run", 4)
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"state": "running", "updated_at": time.time(), "secret": "s3cret"}))
    (run / "status.json").symlink_to(secret)
    assert get(Viewer([run]), "/api/live", run="run") == {"live": False, "status": None}
