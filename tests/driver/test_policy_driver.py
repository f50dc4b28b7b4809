"""The driver's policy: versions on every call, staleness drop and re-run, pause and resume
around a weight update, on the LocalExecutor (issue 12 §4, §5)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from rollout_ray import ChatHarness, Request
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._record.store import read_run
from rollout_ray._record.trace import decode_trace
from rollout_ray.testing import ScriptedModel

from conftest import tasks


class Bumping(ScriptedModel):
    """Runs ``on_first`` (e.g. a version bump) while its first call is in flight."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_first: Callable[[], Awaitable[None]] | None = None

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Any:
        on_first, self.on_first = self.on_first, None
        if on_first is not None:
            await on_first()
        return await super().complete(request, model=model, sampling=sampling)


class Held(ScriptedModel):
    """Holds every call until ``release``; ``arrived`` is set once ``expect`` calls are in."""

    def __init__(self, expect: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.expect, self.arrived, self.release = expect, asyncio.Event(), asyncio.Event()

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Any:
        response = await super().complete(request, model=model, sampling=sampling)
        if len(self.requests) >= self.expect:
            self.arrived.set()
        await self.release.wait()
        return response


def versions(samples: Any) -> list[list[int | None]]:
    return [[c.policy for c in decode_trace(blob).calls] for blob in samples.column("trace").to_pylist()]


def test_a_stale_rollout_is_dropped_and_run_again_and_stored_once(tmp_path: Any, caplog_info: Any) -> None:
    model = Bumping(default="4")
    config = EvalConfig(samples_per_task=2, max_in_flight=1, max_staleness=0)

    async def main() -> Any:
        async with LocalExecutor() as executor:
            driver = Driver(
                tasks(1), ChatHarness(retries=0), model, executor=executor, config=config, run_dir=str(tmp_path / "run")
            )
            model.on_first = lambda: driver.set_policy_version(1)  # sample 0 was sent at version 0
            return driver, await driver.arun()

    driver, result = asyncio.run(main())
    assert (driver.progress.stale, result.stale, driver.progress.done) == (1, 1, 2)
    stored = read_run(str(tmp_path / "run"))
    assert sorted(stored.column("sample_idx").to_pylist()) == [0, 1]  # the stale one never stored
    assert versions(stored) == [[1], [1]]
    assert len(model.requests) == 3
    assert "staleness: 1 rollouts dropped as older than max_staleness=0 versions and re-run" in caplog_info.text


def test_within_max_staleness_nothing_is_dropped() -> None:
    model = Bumping(default="4")
    config = EvalConfig(samples_per_task=2, max_in_flight=1, max_staleness=1)

    async def main() -> Any:
        async with LocalExecutor() as executor:
            driver = Driver(tasks(1), ChatHarness(retries=0), model, executor=executor, config=config)
            model.on_first = lambda: driver.set_policy_version(1)
            return driver, await driver.arun()

    driver, result = asyncio.run(main())
    assert (driver.progress.stale, result.samples.num_rows) == (0, 2)
    assert sorted(versions(result.samples)) == [[0], [1]]


def test_pause_lets_calls_in_flight_finish_and_calls_after_resume_carry_the_new_version() -> None:
    model = Held(expect=2, default="4")
    config = EvalConfig(samples_per_task=1, max_in_flight=2)

    async def main() -> tuple[Driver, list[list[list[int | None]]], list[bool]]:
        async with LocalExecutor() as executor:
            driver = Driver(tasks(4), ChatHarness(retries=0), model, executor=executor, config=config, policy_version=7)
            seen: list[list[list[int | None]]] = []
            paused: list[bool] = []
            stream = driver.groups()
            first = asyncio.ensure_future(anext(stream))
            await model.arrived.wait()  # two rollouts have their call in flight
            await driver.pause()
            model.release.set()  # in flight: they finish, paused or not
            seen.append(versions((await first).samples))
            seen.append(versions((await anext(stream)).samples))
            paused.append(executor.policy.paused and len(model.requests) == 2)  # nothing new sent
            await driver.resume(version=8)
            seen.extend([versions(group.samples) async for group in stream])
            return driver, seen, paused

    driver, seen, paused = asyncio.run(main())
    assert paused == [True]
    assert seen == [[[7]], [[7]], [[8]], [[8]]]  # none lost; the held calls went at 8
    assert (driver.policy_version, driver.executor.policy.paused, driver.progress.done) == (8, False, 4)


def test_paused_context_bumps_on_success_and_keeps_the_version_on_failure() -> None:
    async def main() -> list[tuple[int, bool]]:
        async with LocalExecutor() as executor:
            driver = Driver(tasks(1), ChatHarness(), ScriptedModel(default="4"), executor=executor)
            states = []
            async with driver.paused(version=1):
                states.append((driver.policy_version, executor.policy.paused))
            states.append((driver.policy_version, executor.policy.paused))
            with pytest.raises(RuntimeError, match="^sync failed$"):
                async with driver.paused(version=2):
                    raise RuntimeError("sync failed")
            states.append((driver.policy_version, executor.policy.paused))
            with pytest.raises(ValueError, match="must not go back: 0 is below the current 1"):
                await driver.set_policy_version(0)
            return states

    assert asyncio.run(main()) == [(0, True), (1, False), (1, False)]


def test_a_local_executor_keeps_its_policy_apart_from_the_process() -> None:
    from rollout_ray._core.policy_gate import process_gate

    before = process_gate().state()

    async def main() -> tuple[Any, Any]:
        async with LocalExecutor() as executor:
            await executor.set_policy(5, True)
            return executor.policy.state(), process_gate().state()

    ours, process = asyncio.run(main())
    assert ours == (5, True) and process == before


def test_the_closer_waits_for_a_group_sent_back_and_ends_once_it_is_abandoned() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from rollout_ray._driver.finalize import FinalizeConfig
    from rollout_ray._driver.group_finalizer import GroupFinalizer
    from rollout_ray._record.arrow import RolloutRecord
    from rollout_ray._record.trace import Trace, TraceTask

    async def main() -> tuple[list[str], bool]:
        emitted: list[str] = []
        demand, sent_back = asyncio.Semaphore(0), asyncio.Event()

        def keep(group_id: str, members: Any) -> dict[int, str] | None:
            if group_id == "b":
                sent_back.set()
            return None if group_id == "b" else {}

        closer = GroupFinalizer(
            config=FinalizeConfig(),
            judge=None,
            store=None,
            io=ThreadPoolExecutor(1),
            emit=lambda g: asyncio.sleep(0, emitted.append(g.group_id)),
            rows_per_write=256,
            keep=keep,
            demand=demand,
        )
        running = asyncio.create_task(closer.run())
        for group_id in ("a", "b"):
            await closer.close(group_id, [RolloutRecord(Trace(task=TraceTask(type="T")), "run", group_id, 0)])
        closer.finish()
        demand.release()
        demand.release()
        await sent_back.wait()  # "a" was emitted, "b" is out for a re-run
        waiting = not running.done()
        closer.abandon("b")
        await asyncio.wait_for(running, 5)
        return emitted, waiting

    assert asyncio.run(main()) == (["a"], True)


def test_a_program_behind_the_local_proxy_records_the_executors_version() -> None:
    import pathlib
    import sys

    from rollout_ray import ProgramHarness

    agent = (pathlib.Path(__file__).parents[2] / "examples" / "agent_program.py").read_text()
    harness = ProgramHarness([sys.executable, "agent_program.py"], files={"agent_program.py": agent})

    async def main() -> Any:
        async with LocalExecutor(runtime="local") as executor:
            driver = Driver(tasks(1), harness, ScriptedModel(default="4"), executor=executor, policy_version=6)
            return await driver.arun()

    result = asyncio.run(main())
    assert versions(result.samples) == [[6]] and result.samples["reward"].to_pylist() == [1.0]
