"""A run directory's files are opened relative to its descriptor and follow no link (issue 21
§1): what someone else planted in a run directory is refused by name, never written through,
and nothing outside the run directory changes."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from rollout_ray._errors import CorruptRun
from rollout_ray._record.run_files import RunFiles
from rollout_ray._record.run_layout import LOCK, MANIFEST, RunLayout
from rollout_ray._record.store import Manifest, RunLock, ShardWriter, read_manifest, read_run, write_manifest

pytestmark = pytest.mark.security

PRECIOUS = b"precious\n"


def link_message(path: Path) -> str:
    return (
        rf"^{path} is a symbolic link; a run directory and what it holds are never reached through one: "
        r"remove the link, or pass the directory itself$"
    )


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the run directory that a planted link points to."""
    victim = tmp_path / "outside.txt"
    victim.write_bytes(PRECIOUS)
    return victim


def test_a_file_is_replaced_whole_and_a_crashed_writes_leftover_is_not_written_through(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with RunFiles.open(run_dir, create=True) as run:
        (run_dir / "status.json.tmp").write_bytes(b"half a write")  # a crash mid-write left it
        run.write_bytes("status.json", b"one")
        run.write_bytes("status.json", b"two")
        assert run.read_bytes("status.json") == b"two"
    assert sorted(os.listdir(run_dir)) == ["status.json"]


@pytest.mark.parametrize("planted", ["manifest.json.tmp", "manifest.json"])
def test_a_link_planted_where_the_manifest_is_written_is_refused(tmp_path: Path, outside: Path, planted: str) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / planted).symlink_to(outside)
    with pytest.raises(CorruptRun, match=link_message(run_dir / planted)):
        write_manifest(run_dir, Manifest(run_id="r"))
    assert outside.read_bytes() == PRECIOUS and os.path.islink(run_dir / planted)


def test_a_planted_lock_link_or_hard_link_is_refused_and_its_target_keeps_its_content(
    tmp_path: Path, outside: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK).symlink_to(outside)
    with pytest.raises(CorruptRun, match=link_message(run_dir / LOCK)):
        RunLock(run_dir).acquire()
    (run_dir / LOCK).unlink()
    os.link(outside, run_dir / LOCK)
    with pytest.raises(
        CorruptRun,
        match=rf"^{run_dir / LOCK} has 2 names \(a hard link\): a run's lock is its "
        r"own file; remove it, or use another directory$",
    ):
        RunLock(run_dir).acquire()
    assert outside.read_bytes() == PRECIOUS


def test_a_dangling_link_is_refused_not_created_through(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    target = tmp_path / "made-through-the-link"
    (run_dir / LOCK).symlink_to(target)
    (run_dir / "manifest.json.tmp").symlink_to(target)
    with pytest.raises(CorruptRun, match="is a symbolic link"):
        RunLock(run_dir).acquire()
    with pytest.raises(CorruptRun, match="is a symbolic link"):
        write_manifest(run_dir, Manifest(run_id="r"))
    assert not target.exists()


def test_a_link_to_a_shard_folder_or_a_shard_is_refused_for_writing_and_reading(tmp_path: Path, outside: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_dir = tmp_path / "run"
    write_manifest(run_dir, Manifest(run_id="r"))
    (run_dir / "shards").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(CorruptRun, match=link_message(run_dir / "shards")):
        ShardWriter(run_dir)
    with pytest.raises(CorruptRun, match=link_message(run_dir / "shards")):
        read_run(run_dir)
    (run_dir / "shards").unlink()
    (run_dir / "shards").mkdir()
    (run_dir / "shards" / "part-00000.parquet").symlink_to(outside)
    with pytest.raises(CorruptRun, match=link_message(run_dir / "shards" / "part-00000.parquet")):
        read_run(run_dir)
    assert os.listdir(elsewhere) == [] and outside.read_bytes() == PRECIOUS


def test_a_planted_shard_tmp_link_is_refused_and_the_rows_stay_buffered(tmp_path: Path, outside: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "groups").mkdir(parents=True)
    (run_dir / "groups" / "part-00000.parquet.tmp").symlink_to(outside)
    writer = ShardWriter(run_dir, part="groups")
    writer.write(pa.table({"group_id": ["g"]}))
    with pytest.raises(CorruptRun, match=link_message(run_dir / "groups" / "part-00000.parquet.tmp")):
        writer.flush()
    assert writer.statistics().buffered_rows == 1 and outside.read_bytes() == PRECIOUS


def test_a_fifo_planted_as_the_manifest_is_refused_without_blocking(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / MANIFEST)
    with pytest.raises(CorruptRun, match=rf"^{run_dir / MANIFEST} is not a regular file"):
        read_manifest(run_dir)


def test_a_run_directory_that_is_a_link_is_refused_its_parents_are_the_callers(tmp_path: Path) -> None:
    real = tmp_path / "real"
    write_manifest(real / "run", Manifest(run_id="r"))
    (tmp_path / "run-link").symlink_to(real / "run", target_is_directory=True)
    (tmp_path / "parent-link").symlink_to(real, target_is_directory=True)
    with pytest.raises(CorruptRun, match=link_message(tmp_path / "run-link")):
        read_manifest(tmp_path / "run-link")
    with pytest.raises(CorruptRun, match=link_message(tmp_path / "run-link")):
        RunLayout.of(tmp_path / "run-link").holds_run()
    assert read_manifest(tmp_path / "parent-link" / "run").run_id == "r"


def test_below_a_chosen_root_no_directory_on_the_way_is_a_link(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    write_manifest(elsewhere / "point", Manifest(run_id="outside"))
    root.mkdir()
    (root / "sweep").symlink_to(elsewhere, target_is_directory=True)
    assert read_manifest(root / "sweep" / "point").run_id == "outside"  # the path alone follows it
    with pytest.raises(CorruptRun, match=link_message(root / "sweep")):
        read_manifest(RunLayout(root / "sweep" / "point", within=root))


def test_clearing_a_run_removes_links_inside_and_follows_none(tmp_path: Path, outside: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "keep").mkdir(parents=True)
    run_dir = tmp_path / "run"
    write_manifest(run_dir, Manifest(run_id="r"))
    (run_dir / "shards").mkdir()
    (run_dir / "shards" / "into").symlink_to(elsewhere, target_is_directory=True)
    (run_dir / "file-link").symlink_to(outside)
    (run_dir / "dir-link").symlink_to(elsewhere, target_is_directory=True)
    (run_dir / LOCK).write_text("1\n")
    with RunLayout.of(run_dir).open() as run:
        run.remove_all(keep=[LOCK], last=MANIFEST)
    assert os.listdir(run_dir) == [LOCK]
    assert outside.read_bytes() == PRECIOUS and os.listdir(elsewhere) == ["keep"]


@pytest.mark.parametrize("name", ["status.json", "control.json"])
def test_the_live_drivers_files_are_written_through_no_link(tmp_path: Path, outside: Path, name: str) -> None:
    from rollout_ray._driver.control import write_run_file

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / f"{name}.tmp").symlink_to(outside)
    with pytest.raises(CorruptRun, match=link_message(run_dir / f"{name}.tmp")):
        write_run_file(run_dir / name, b"{}", 0o600)
    assert outside.read_bytes() == PRECIOUS
    (run_dir / f"{name}.tmp").unlink()
    write_run_file(run_dir / name, b"{}", 0o600)
    assert (run_dir / name).read_bytes() == b"{}" and (run_dir / name).stat().st_mode & 0o777 == 0o600


def test_a_score_version_whose_write_fails_leaves_no_temporary_folder(tmp_path: Path) -> None:
    from rollout_ray._record.score_versions import write_version

    (tmp_path / "scores").mkdir()
    with pytest.raises(AttributeError):  # Parquet cannot write a samples "table" that is None
        write_version(tmp_path, None, pa.table({"g": [1]}), {})  # type: ignore[arg-type]
    assert list((tmp_path / "scores").iterdir()) == []  # no v2.tmp left, no v2
