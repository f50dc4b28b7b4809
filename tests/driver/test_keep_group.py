"""Groups that carry signal (issue 22 §4): the keep rule, over-sampling until the wanted groups
are in, and an infrastructure loss that does not cost its group."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from driver_fakes import Timed

from rollout_ray import ChatHarness
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._record.store import read_groups, read_manifest
from rollout_ray.testing import ScriptedModel

from conftest import Echo, run, tasks


def split_rewards(idx: int, run: int) -> float:
    """Even tasks: every sample scores 1 (no signal); odd tasks: samples score 1, 0, 1, 0, ..."""
    return 1.0 if idx % 2 == 0 else float(run % 2)


def drive(config: EvalConfig, task_list: Any, executor: Timed | None = None, **kwargs: Any) -> tuple[Driver, list[Any]]:
    async def main() -> tuple[Driver, list[Any]]:
        driver = Driver(
            task_list,
            ChatHarness(),
            ScriptedModel(),
            executor=executor or Timed(reward=split_rewards),
            config=config,
            **kwargs,
        )
        return driver, [group async for group in driver.groups()]

    return run(main())


@pytest.mark.parametrize("max_staleness", [None, 3])
def test_nonzero_std_streams_only_groups_whose_rewards_differ_and_stores_the_rest_with_the_reason(
    tmp_path: Path, max_staleness: int | None
) -> None:
    config = EvalConfig(samples_per_task=2, keep_group="nonzero_std", max_staleness=max_staleness)
    driver, groups = drive(config, tasks(6), run_dir=str(tmp_path / "run"))
    assert sorted(g.group_id[0] for g in groups) == ["1", "3", "5"]
    assert all(g.summary["std"].to_pylist()[0] > 0 for g in groups)
    stored = {r["group_id"][0]: r["rejected"] for r in read_groups(str(tmp_path / "run")).to_pylist()}
    assert stored == {
        "0": "nonzero_std: the rewards do not differ (std 0.0)",
        "1": None,
        "2": "nonzero_std: the rewards do not differ (std 0.0)",
        "3": None,
        "4": "nonzero_std: the rewards do not differ (std 0.0)",
        "5": None,
    }
    assert driver.progress.rejected == 3 and driver.progress.done == 12


def test_a_callable_rule_sees_the_finalized_group_and_is_named_in_the_reason_and_the_manifest(tmp_path: Path) -> None:
    def some_correct(samples: pa.Table) -> bool:
        return "advantage" in samples.column_names and 1.0 in samples["reward"].to_pylist()

    config = EvalConfig(samples_per_task=2, keep_group=some_correct)
    executor = Timed(reward=lambda idx, run: float(idx == 1))
    _, groups = drive(config, tasks(3), executor, run_dir=str(tmp_path / "run"))
    assert [g.group_id[0] for g in groups] == ["1"]
    reasons = [r["rejected"] for r in read_groups(str(tmp_path / "run")).to_pylist()]
    name = "test_a_callable_rule_sees_the_finalized_group_and_is_named_in_the_reason_and_the_manifest.<locals>.some_correct"
    assert sorted(reasons, key=lambda r: r is None) == [f"keep_group {name} returned false"] * 2 + [None]
    assert read_manifest(str(tmp_path / "run")).config["eval"]["keep_group"] == name


def test_max_groups_admits_further_tasks_of_an_endless_taskset_until_the_kept_groups_are_in() -> None:
    """Half the groups carry no signal: each rejected one is replaced by the next task; the run
    ends with exactly the wanted groups streamed, having read one task per group admitted."""
    read: list[int] = []

    def endless() -> Iterator[Echo]:
        for i in itertools.count():
            read.append(i)
            yield Echo({"idx": i, "prompt": f"question {i}"})

    config = EvalConfig(samples_per_task=2, max_in_flight=4, keep_group="nonzero_std", max_groups=5)
    driver, groups = drive(config, endless(), Timed(reward=split_rewards, duration=lambda idx: 1.0 + idx % 3))
    assert len(groups) == 5 and all(int(g.group_id.split("-")[0]) % 2 == 1 for g in groups)
    assert driver.status == "completed" and driver.progress.in_flight == 0
    assert read == list(range(10))  # tasks 0-9: five rejected, five kept; task 10 never read
    assert driver.progress.rejected == 5


def test_max_groups_without_a_rule_runs_only_that_many_groups_of_a_long_taskset() -> None:
    executor = Timed()
    driver, groups = drive(EvalConfig(samples_per_task=3, max_in_flight=64, max_groups=4), tasks(100), executor)
    assert len(groups) == 4 and len(executor.started) == 12
    assert driver.progress.total is None  # not 300: no progress bar or ETA promises rollouts that never run


def test_one_infrastructure_loss_reruns_the_sample_and_the_group_streams_complete() -> None:
    executor = Timed(lose=lambda idx, run: idx == 0 and run == 1)
    _, groups = drive(EvalConfig(samples_per_task=3, max_infra_retries=1), tasks(2), executor)
    assert sorted(g.group_id[0] for g in groups) == ["0", "1"]
    first = next(g for g in groups if g.group_id.startswith("0"))
    assert first.samples["ok"].to_pylist() == [True] * 3
    assert sorted(first.samples["attempt"].to_pylist()) == [0, 0, 1]
    assert executor.runs == {0: 4, 1: 3}


def test_a_keep_rule_that_raises_fails_the_run_with_its_error() -> None:
    def broken(samples: pa.Table) -> bool:
        raise RuntimeError("rule broke")

    with pytest.raises(RuntimeError, match="^rule broke$"):
        run(
            asyncio.wait_for(
                Driver(
                    tasks(2), ChatHarness(), ScriptedModel(), executor=Timed(), config=EvalConfig(keep_group=broken)
                ).arun(),
                60,
            )
        )
