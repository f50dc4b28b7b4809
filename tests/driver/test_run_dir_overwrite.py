"""``Driver(overwrite=True)``: a stored run is replaced, and nothing but a run directory's
contents is ever removed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from rollout_ray import ChatHarness
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._errors import CorruptRun
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._record.store import read_manifest, read_run
from rollout_ray.testing import ScriptedModel

from conftest import tasks


def drive(n_tasks: int, run_dir: Path, **kwargs: Any) -> Any:
    async def main() -> Any:
        async with LocalExecutor() as ex:
            return await Driver(
                tasks(n_tasks),
                ChatHarness(retries=0),
                ScriptedModel(default="4"),
                executor=ex,
                config=EvalConfig(),
                run_dir=str(run_dir),
                **kwargs,
            ).arun()

    return asyncio.run(main())


def test_overwrite_replaces_the_stored_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    drive(3, run_dir)
    first = read_manifest(run_dir).run_id
    with pytest.raises(
        FileExistsError,
        match=r"already holds a run; pass resume=True to continue it, "
        r"overwrite=True to replace it, or another directory$",
    ):
        drive(1, run_dir)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (run_dir / "link").symlink_to(outside, target_is_directory=True)
    (run_dir / "notes.txt").write_text("old")
    result = drive(1, run_dir, overwrite=True)
    assert read_manifest(run_dir).run_id != first
    assert result.samples.num_rows == 1 and read_run(str(run_dir)).num_rows == 1
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "groups", "manifest.json", "shards", "status.json"]
    assert (outside / "keep.txt").read_text() == "mine"  # the link was removed, not followed


def test_overwrite_removes_nothing_from_a_directory_that_holds_no_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "mine"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    drive(1, run_dir, overwrite=True)
    assert (run_dir / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("mode", [{"overwrite": True}, {"resume": True}, {}])
def test_a_run_directory_that_is_a_symbolic_link_is_refused(tmp_path: Path, mode: dict[str, bool]) -> None:
    run_dir = tmp_path / "run"
    drive(1, run_dir)
    (tmp_path / "link").symlink_to(run_dir, target_is_directory=True)
    with pytest.raises(
        CorruptRun,
        match=r"/link is a symbolic link; a run directory and what it holds are never "
        r"reached through one: remove the link, or pass the directory itself$",
    ):
        drive(1, tmp_path / "link", **mode)
    assert read_run(str(run_dir)).num_rows == 1


def test_resume_and_overwrite_exclude_each_other() -> None:
    with pytest.raises(ValueError, match=r"^resume and overwrite exclude each other: continue the run, or replace it$"):
        Driver(tasks(1), ChatHarness(), ScriptedModel(), executor=LocalExecutor(), resume=True, overwrite=True)
