"""A stored run finalized again: another pass@k or another judge, from the public API (issue 19 §1)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa

from rollout_ray import ChatHarness, Driver, EvalConfig, FinalizeConfig, LocalExecutor, finalize, read_groups, read_run
from rollout_ray.testing import ScriptedModel

from conftest import tasks


def test_a_stored_run_is_finalized_again_with_its_group_columns_replaced(tmp_path: Path) -> None:
    out = str(tmp_path / "run")
    replies = ["4", "5", "4", "4", "5", "5"]  # one at a time, in order: task 0 one right, 1 both, 2 none

    async def main() -> None:
        async with LocalExecutor() as executor:
            model = ScriptedModel(replies)
            await Driver(
                tasks(3),
                ChatHarness(retries=0),
                model,
                executor=executor,
                config=EvalConfig(samples_per_task=2, max_in_flight=1),
                run_dir=out,
            ).arun()

    asyncio.run(main())
    stored = read_run(out)
    assert "pass_at_2" not in stored.column_names and read_groups(out).num_rows == 3

    def judge(group: pa.Table) -> dict[str, list[float]]:
        return {"metric_group_rows": [float(group.num_rows)] * group.num_rows}

    again = finalize(stored, FinalizeConfig(pass_k=(1, 2)), judge=judge)
    assert again.samples.num_rows == 6 and again.samples.column_names.count("advantage") == 1
    assert again.samples["pass_at_2"].to_pylist() == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert again.samples["metric_group_rows"].to_pylist() == [2.0] * 6
    assert again.groups["n_correct"].to_pylist() == [1, 2, 0]
