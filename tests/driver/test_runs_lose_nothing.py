"""Runs lose nothing and mix nothing (issue 10 §6): resume redoes what failed for reasons
outside the task, refuses other settings, and takes the run's lock; a run directory refuses
rows of another run and a broken manifest; a judge, a NaN reward or an unrunnable spec fails
its own group or rollout, not the run; the end of a run reads back no conversations."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout_ray import (
    ChatHarness,
    CorruptRun,
    LocalExecutor,
    ProviderError,
    ResumeMismatch,
    RunInUse,
    Task,
    Trace,
    read_run,
    reward,
)
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._record.store import read_groups
from rollout_ray.testing import Reply, ScriptedModel

from conftest import tasks

pytestmark = pytest.mark.faults
SCRIPTS = Path(__file__).resolve().parents[1] / "fault_scripts"


def _drive(
    run_dir: Path,
    model: Any,
    *,
    n: int = 4,
    samples: int = 1,
    resume: bool = False,
    keep_failed: bool = False,
    judge: Any = None,
    task_list: Any = None,
    manifest: dict[str, Any] | None = None,
) -> Any:
    async def main() -> Any:
        async with LocalExecutor() as executor:
            driver = Driver(
                task_list or tasks(n),
                ChatHarness(retries=0),
                model,
                executor=executor,
                config=EvalConfig(samples_per_task=samples, breaker=100),
                run_dir=str(run_dir),
                resume=resume,
                keep_failed=keep_failed,
                judge=judge,
                manifest_config=manifest or {"model": "m"},
            )
            return await driver.arun()

    return asyncio.run(main())


def test_resume_redoes_provider_failures_and_keeps_their_errors(tmp_path: Path, report: Any) -> None:
    down = ScriptedModel(default=ProviderError("model server down", 503))
    first = _drive(tmp_path / "run", down)
    assert [r["error_type"] for r in first.samples.to_pylist()] == ["ProviderError"] * 4
    t0 = time.monotonic()
    second = _drive(tmp_path / "run", ScriptedModel(default="4"), resume=True)
    rows = second.samples.to_pylist()
    assert [(r["ok"], r["reward"]) for r in rows] == [(True, 1.0)] * 4  # redone, not kept as failures
    # The error columns describe the final attempt (issue 21 §5), the earlier ones are its history.
    assert [(r["error_type"], r["error_message"], r["num_errors"]) for r in rows] == [(None, None, 0)] * 4
    traces = {t.task.idx: t for t in _traces(tmp_path / "run")}
    assert all([e.type for e in t.errors] == ["ProviderError"] for t in traces.values())  # history kept
    kept = tmp_path / "kept"
    _drive(kept, down)
    assert {
        r["ok"] for r in _drive(kept, ScriptedModel(default="4"), resume=True, keep_failed=True).samples.to_pylist()
    } == {False}
    report(
        "10§6 resume after a model outage",
        "4 rollouts failed ProviderError 503",
        "4/4 redone ok",
        "0 (errors of the failed attempts kept)",
        time.monotonic() - t0,
    )


def _traces(run_dir: Path) -> list[Trace]:
    from rollout_ray import table_to_traces

    return table_to_traces(read_run(run_dir))


def test_resume_with_other_settings_is_refused_naming_them(tmp_path: Path) -> None:
    _drive(tmp_path, ScriptedModel(default="4"), samples=1)
    with pytest.raises(ResumeMismatch, match=r"other settings \(eval\.samples_per_task: stored 1, given 2\)"):
        _drive(tmp_path, ScriptedModel(default="4"), samples=2, resume=True)
    with pytest.raises(ResumeMismatch, match=r"other settings \(model: stored \"m\", given \"another\"\)"):
        _drive(tmp_path, ScriptedModel(default="4"), resume=True, manifest={"model": "another"})
    assert read_run(tmp_path).num_rows == 4  # nothing mixed in


def test_a_second_writer_of_a_run_is_refused(tmp_path: Path, report: Any) -> None:
    slow = ScriptedModel(default=Reply("4", delay=0.5))

    async def main() -> Any:
        async with LocalExecutor() as executor:
            first = Driver(tasks(2), ChatHarness(), slow, executor=executor, run_dir=str(tmp_path))
            running = asyncio.create_task(first.arun())
            while not (tmp_path / "manifest.json").exists():
                await asyncio.sleep(0.01)
            second = Driver(tasks(2), ChatHarness(), slow, executor=executor, run_dir=str(tmp_path), resume=True)
            with pytest.raises(RunInUse, match=r"is in use by another process \(pid \d+\)"):
                await second.arun()
            return await running

    t0 = time.monotonic()
    result = asyncio.run(main())
    assert result.samples.num_rows == 2 and read_run(tmp_path).num_rows == 2
    report(
        "10§6 two writers of one run",
        "a second driver on a running run dir",
        "refused: RunInUse",
        "0 duplicated, 0 missing",
        time.monotonic() - t0,
    )


def test_a_shard_of_another_run_is_refused(tmp_path: Path) -> None:
    _drive(tmp_path / "a", ScriptedModel(default="4"))
    _drive(tmp_path / "b", ScriptedModel(default="4"))
    stray = sorted((tmp_path / "b" / "shards").iterdir())[0]
    shutil.copy(stray, tmp_path / "a" / "shards" / "part-00099.parquet")
    with pytest.raises(CorruptRun, match=r"part-00099\.parquet holds rows of run \w+, not of this run"):
        read_run(tmp_path / "a")
    with pytest.raises(CorruptRun):
        _drive(tmp_path / "a", ScriptedModel(default="4"), resume=True)


def test_a_shard_with_an_extra_column_is_read(tmp_path: Path) -> None:
    _drive(tmp_path, ScriptedModel(default="4"), n=2)
    first = sorted((tmp_path / "shards").iterdir())[0]
    table = pq.read_table(first)
    pq.write_table(table.append_column("note", pa.array(["x"] * table.num_rows)), first)
    assert read_run(tmp_path).num_rows == 2 and "note" in read_run(tmp_path).column_names


def test_a_truncated_manifest_is_one_clear_error(tmp_path: Path) -> None:
    _drive(tmp_path, ScriptedModel(default="4"), n=1)
    manifest = tmp_path / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:20])
    with pytest.raises(CorruptRun, match=r"manifest\.json is not a readable run manifest"):
        _drive(tmp_path, ScriptedModel(default="4"), n=1, resume=True)


def test_a_judge_that_raises_fails_its_group_not_the_run(tmp_path: Path, report: Any) -> None:
    def judge(group: pa.Table) -> dict[str, list[float]] | None:
        if group["task_idx"][0].as_py() == 1:
            raise RuntimeError("grader unreachable")
        return {"reward_judge": [1.0] * group.num_rows}

    t0 = time.monotonic()
    result = _drive(tmp_path, ScriptedModel(default="4"), n=3, samples=2, judge=judge)
    assert result.samples.num_rows == 6 and read_run(tmp_path).num_rows == 6  # all stored
    errors = dict(zip(read_groups(tmp_path)["group_id"].to_pylist(), read_groups(tmp_path)["judge_error"].to_pylist()))
    failed = [g for g, e in errors.items() if e is not None]
    assert len(failed) == 1 and errors[failed[0]] == "RuntimeError: grader unreachable"
    judged = [r["reward_judge"] for r in result.samples.to_pylist() if r["group_id"] not in failed]
    assert judged == [1.0] * 4
    report(
        "10§6 judge raises",
        "1 of 3 groups' judge raises",
        "judge_error on that group",
        "0 rows lost (6/6)",
        time.monotonic() - t0,
    )


class NaNReward(Task):
    @reward
    def broken(self, trace: Trace) -> float:
        return math.nan if self.data.idx == 0 else 1.0


def test_a_nan_reward_is_a_task_error(tmp_path: Path) -> None:
    result = _drive(
        tmp_path, ScriptedModel(default="4"), task_list=[NaNReward({"idx": i, "prompt": "q"}) for i in range(2)]
    )
    rows = {r["task_idx"]: r for r in result.samples.to_pylist()}
    assert not rows[0]["ok"] and rows[0]["error_type"] == "TaskError" and "nan" in rows[0]["error_message"]
    assert rows[1]["ok"] and rows[1]["reward"] == 1.0


@pytest.mark.slow
def test_the_end_of_a_run_reads_no_conversation_back(tmp_path: Path, report: Any) -> None:
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "big_run.py"), str(tmp_path / "run"), "800"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["rows"] == 800 and facts["stored_trace_mib"] > 40
    # Arrow's peak over the whole run: a few shards' worth (~16 MiB here, more when a loaded
    # machine lets finished groups gather), not the whole run's conversations (all of them).
    assert facts["arrow_peak_mib"] < facts["stored_trace_mib"] / 2
    report(
        "10§6 memory at the end of a run",
        f"800 rollouts, {facts['stored_trace_mib']:.0f} MiB of traces",
        f"Arrow peak {facts['arrow_peak_mib']:.0f} MiB",
        "flat (was the whole run)",
        time.monotonic() - t0,
    )


def test_the_end_of_a_run_reads_its_samples_only_when_asked_for(tmp_path: Path) -> None:
    """Issue 32 §3: ``arun`` grew +117 MiB at its end for 100,000 tasks: it read the whole
    samples table back (``bench_driver_memory.py``). Its end allocates no Arrow memory that
    grows with the run; ``result.samples`` reads the same rows when asked for."""
    n = 1500
    run_dir = tmp_path / "run"

    async def main() -> tuple[Any, int, int]:
        async with LocalExecutor(runtime="local") as executor:
            driver = Driver(
                tasks(n),
                ChatHarness(),
                ScriptedModel(default="4"),
                executor=executor,
                run_dir=str(run_dir),
                config=EvalConfig(samples_per_task=1, max_in_flight=64),
            )
            before = pa.total_allocated_bytes()
            result = await driver.arun()
            return result, before, pa.total_allocated_bytes()

    result, before, at_end = asyncio.run(main())
    samples, groups = result.samples, result.groups
    assert samples.num_rows == n and groups.num_rows == n and all(samples["ok"].to_pylist())
    assert samples.equals(read_run(run_dir, conversation=False)) and groups.equals(read_groups(run_dir))
    assert "messages" not in samples.column_names
    assert at_end - before < samples.nbytes / 4, (at_end - before, samples.nbytes)  # the table: ~1 MiB here
    shutil.rmtree(run_dir)
    assert result.samples is samples  # read once, then kept
