"""Staleness by admission, not by discard (issue 22 §3): with ``max_staleness=k`` and
``batch_groups=B`` a group is admitted only while ``s + o < (k + 1) × B`` (``admission``), so
a lagging trainer slows admission instead of paying in re-runs; a sample that still ends too
stale is re-run or masked (``stale_samples``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from driver_fakes import Timed

from rollout_ray import ChatHarness
from rollout_ray._driver.admission import Admission
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._record.trace import decode_trace
from rollout_ray.testing import ScriptedModel

from conftest import run, tasks


async def admits(admission: Admission) -> bool:
    """Whether ``room`` answers without waiting (the virtual clock: a wait times out at once)."""
    try:
        return await asyncio.wait_for(admission.room(), 0.001)
    except TimeoutError:
        return False


def test_the_window_is_k_plus_1_batches_counted_from_the_current_version() -> None:
    async def main() -> list[Any]:
        a = Admission(version=5, max_staleness=1, batch_groups=2, max_groups=None)
        seen = []
        for _ in range(4):  # (1 + 1) x 2 groups may run ahead of a trainer at version 5
            seen.append(await admits(a))
            a.admit()
        seen.append(await admits(a))  # a fifth would be consumed under version 7
        a.stream()
        a.stream()  # the trainer took its batch of two: still version 5
        seen.append(await admits(a))
        a.version(6)  # it updated: two more fit
        seen += [await admits(a), a.admit(), await admits(a), a.admit(), await admits(a)]
        return [s for s in seen if s is not None] + [a.held]

    assert run(main()) == [True] * 4 + [False, False, True, True, False, 0]


def test_a_trainer_taking_more_than_a_batch_per_version_is_counted_as_holding_its_batch() -> None:
    """Past ``B`` groups at one version, the trainer holds its batch: the next groups are
    consumed under the next version at the earliest, so the window does not shrink further."""

    async def main() -> list[bool]:
        a = Admission(version=0, max_staleness=1, batch_groups=2, max_groups=None)
        for _ in range(4):
            a.admit()
        for _ in range(3):  # three groups taken at version 0
            a.stream()
        return [await admits(a), await admits(a) if a.admit() is None else False]

    assert run(main()) == [True, False]  # s = 2 (not 3) + o = 2 → one more: 2 + 1 < 4


def test_nothing_open_and_the_consumer_waiting_admits_one_group_and_warns(caplog: Any) -> None:
    async def main() -> list[bool]:
        a = Admission(version=0, max_staleness=0, batch_groups=1, max_groups=None)
        a.admit()
        a.stream()  # s = 1 = B, o = 0: the trainer is thought to train
        before = await admits(a)
        a.consumer_waits(True)  # but it asks for another group at the same version
        return [before, await admits(a)]

    with caplog.at_level(logging.WARNING, logger="rollout_ray"):
        assert run(main()) == [False, True]
    assert "the consumer took 1 groups at policy version 0, more than batch_groups=1" in caplog.text


def staleness(group: Any, version: int) -> list[int]:
    """Versions between each sample's first model call and ``version``."""
    return [version - decode_trace(blob).calls[0].policy for blob in group.samples["trace"].to_pylist()]


def lagging_trainer(
    config: EvalConfig, *, n: int = 24, batch: int = 2, training: float = 10.0, duration: Any = lambda idx: 1.0
) -> tuple[Driver, Timed, list[list[int]]]:
    """Rollouts take a second; the trainer takes ``batch`` groups, trains ``training`` seconds,
    then updates the policy (the virtual clock)."""
    executor = Timed(duration=duration)

    async def main() -> tuple[Driver, list[list[int]]]:
        driver = Driver(tasks(n), ChatHarness(), ScriptedModel(), executor=executor, config=config)
        seen: list[list[int]] = []
        async for group in driver.groups():
            seen.append(staleness(group, driver.policy_version))
            if len(seen) % batch == 0:
                await asyncio.sleep(training)
                async with driver.paused(version=driver.policy_version + 1):
                    pass
        return driver, seen

    driver, seen = run(main())
    return driver, executor, seen


@pytest.mark.parametrize("k", [0, 1, 2])
def test_a_lagging_trainer_holds_admission_back_and_no_rollout_is_rerun(k: int) -> None:
    config = EvalConfig(samples_per_task=2, max_in_flight=64, max_staleness=k, batch_groups=2)
    driver, executor, seen = lagging_trainer(config)
    assert len(seen) == 24 and driver.progress.stale == 0 and len(executor.started) == 48
    assert max(max(s) for s in seen) == k  # run ahead exactly as far as allowed
    assert driver.progress.held > 0


def test_without_admission_the_same_lagging_trainer_pays_in_reruns() -> None:
    """The fallback alone (no ``batch_groups``): every rollout runs at once, most end too stale
    and run again, some several times."""
    config = EvalConfig(samples_per_task=2, max_in_flight=64, max_staleness=1)
    driver, executor, seen = lagging_trainer(config)
    assert len(seen) == 24 and max(max(s) for s in seen) <= 1
    assert driver.progress.stale > 24 and len(executor.started) == 48 + driver.progress.stale


def test_a_sample_that_ends_too_stale_is_masked_not_rerun_and_its_reward_stays_in_the_baseline() -> None:
    """Without admission the trainer lags: with ``stale_samples="mask"`` nothing runs again;
    the stale samples are streamed with ``masked`` set and count in their group's mean."""
    config = EvalConfig(samples_per_task=2, max_in_flight=64, max_staleness=1, stale_samples="mask")
    driver, executor, seen = lagging_trainer(config, n=8)
    assert driver.progress.stale == 0 and len(executor.started) == 16 and len(seen) == 8
    assert driver.progress.masked == sum(s > 1 for stale in seen for s in stale) > 0


def test_masked_samples_are_marked_in_the_stream_and_the_store(tmp_path: Any) -> None:
    config = EvalConfig(samples_per_task=2, max_in_flight=64, max_staleness=0, stale_samples="mask")
    executor = Timed(duration=lambda idx: 1.0, reward=lambda idx, run: float(run % 2))

    async def main() -> list[tuple[list[str | None], list[float], float]]:
        driver = Driver(
            tasks(2), ChatHarness(), ScriptedModel(), executor=executor, config=config, run_dir=str(tmp_path / "run")
        )
        out = []
        async for group in driver.groups():
            out.append(
                (
                    group.samples["masked"].to_pylist(),
                    group.samples["advantage"].to_pylist(),
                    group.summary["mean"].to_pylist()[0],
                )
            )
            await driver.set_policy_version(driver.policy_version + 1)
        return out

    first, second = run(main())
    assert first[0] == [None, None] and second[0] == ["stale", "stale"]  # started under 0, handed on at 1
    assert second[1] == pytest.approx([1.0, -1.0], abs=1e-5) and second[2] == 0.5  # the stale rewards are the baseline
    from rollout_ray._record.store import read_run

    assert sorted(read_run(str(tmp_path / "run"))["masked"].to_pylist(), key=str) == [None, None, "stale", "stale"]
