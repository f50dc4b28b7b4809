"""The driver: scheduling, grouping, retries, the breaker, the stream, shards and resume."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from rollout_ray import ChatHarness, ProviderError, ResumeMismatch, Trace
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._errors import InfrastructureLost
from rollout_ray._hosting.executor import Executor, failed_trace
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._hosting.spec import RolloutSpec
from rollout_ray._record.store import read_run
from rollout_ray.testing import ScriptedHarness, ScriptedModel

from conftest import Echo, tasks


class Flaky(Executor):
    """LocalExecutor that loses the host of chosen (task idx, attempt) runs: it returns them
    lost, as every executor does (``failed_trace`` with an ``InfrastructureLost``)."""

    def __init__(self, lose: Any) -> None:
        self.inner = LocalExecutor()
        self.lose = lose
        self.calls: Counter[int] = Counter()

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()

    async def run(self, spec: RolloutSpec) -> Trace:
        idx = spec.task.data.idx
        self.calls[idx] += 1
        if self.lose(idx, self.calls[idx]):
            return failed_trace(spec, InfrastructureLost("rollout actor died: ActorDiedError"))
        return await self.inner.run(spec)


def drive(n_tasks: int, *, executor: Executor | None = None, model: Any = None, **kwargs: Any) -> Any:
    config = kwargs.pop("config", EvalConfig(samples_per_task=3, max_in_flight=8))

    async def main() -> Any:
        async with executor or LocalExecutor() as ex:
            driver = Driver(
                tasks(n_tasks),
                ChatHarness(retries=0),
                model or ScriptedModel(default="4"),
                executor=ex,
                config=config,
                **kwargs,
            )
            return driver, await driver.arun()

    return asyncio.run(main())


def test_every_task_sample_runs_once_and_groups_are_finalized() -> None:
    driver, result = drive(5)
    assert result.status == "completed" and result.samples.num_rows == 15
    assert result.groups.num_rows == 5
    assert sorted(Counter(result.samples["group_id"].to_pylist()).values()) == [3] * 5
    assert set(result.samples["reward"].to_pylist()) == {1.0}
    assert result.samples["advantage"].to_pylist() == [0.0] * 15
    assert driver.progress.done == 15 and driver.progress.in_flight == 0


def test_lost_rollouts_are_retried_with_every_attempt_recorded() -> None:
    flaky = Flaky(lambda idx, call: idx == 1 and call <= 2)  # the first two runs of task 1 die
    _, result = drive(2, executor=flaky, config=EvalConfig(samples_per_task=1, max_infra_retries=2))
    rows = {r["task_idx"]: r for r in result.samples.to_pylist()}
    # The error columns are the stored attempt's (none); every attempt's errors are its history.
    assert rows[1]["ok"] and rows[1]["attempt"] == 2 and rows[1]["num_errors"] == 0
    assert rows[1]["error_type"] is None and rows[1]["error_message"] is None
    assert [(a["attempt"], [e["type"] for e in a["errors"]]) for a in rows[1]["attempts"]] == [
        (0, ["InfrastructureLost"]),
        (1, ["InfrastructureLost"]),
        (2, []),
    ]
    assert rows[0]["attempt"] == 0 and rows[0]["attempts"] == [{"attempt": 0, "errors": []}]
    assert flaky.calls == {0: 1, 1: 3}


def test_a_rollout_lost_inside_the_local_executor_is_retried_like_one_lost_on_ray() -> None:
    """One path for a lost rollout: the driver reads the trace's typed error, whichever
    executor ran it and however the loss surfaced (here inside the rollout, as a node's lost
    services do on Ray)."""
    seen: Counter[int] = Counter()

    async def lose_the_first_run(ctx: Any) -> None:
        seen[ctx.data.idx] += 1
        if seen[ctx.data.idx] == 1:
            raise InfrastructureLost("the node's services were lost: ActorDiedError")

    async def main() -> Any:
        async with LocalExecutor() as ex:
            driver = Driver(
                tasks(2),
                ScriptedHarness(before_segment=lose_the_first_run),
                ScriptedModel(default="4"),
                executor=ex,
                config=EvalConfig(samples_per_task=1, max_infra_retries=1),
            )
            return await driver.arun()

    rows = sorted(asyncio.run(main()).samples.to_pylist(), key=lambda r: r["task_idx"])
    assert [(r["ok"], r["attempt"]) for r in rows] == [(True, 1), (True, 1)]
    assert [[e["type"] for e in a["errors"]] for a in rows[0]["attempts"]] == [["InfrastructureLost"], []]
    assert seen == {0: 2, 1: 2}


def test_an_executor_that_raises_infrastructure_lost_still_has_its_rollout_retried() -> None:
    """An executor of one's own may raise the loss instead of returning it: same outcome."""

    class Raises(Flaky):
        async def run(self, spec: RolloutSpec) -> Trace:
            trace = await super().run(spec)
            if trace.errors and trace.errors[-1].is_a(InfrastructureLost):
                raise InfrastructureLost(trace.errors[-1].message)
            return trace

    raises = Raises(lambda idx, call: idx == 1 and call == 1)
    _, result = drive(2, executor=raises, config=EvalConfig(samples_per_task=1, max_infra_retries=1))
    rows = {r["task_idx"]: r for r in result.samples.to_pylist()}
    assert rows[1]["ok"] and rows[1]["attempt"] == 1 and raises.calls == {0: 1, 1: 2}


def test_a_rollout_lost_for_good_fails_never_blocks_its_group_and_keeps_it_from_the_stream() -> None:
    """Its retries spent, a lost sample is recorded as failed and its group completes and is
    stored, with the reason it is not streamed: a machine's failure is no reward 0 to learn from."""

    async def main(stream: bool) -> Any:
        async with Flaky(lambda idx, call: idx == 0) as flaky:
            driver = Driver(
                tasks(2),
                ChatHarness(retries=0),
                ScriptedModel(default="4"),
                executor=flaky,
                config=EvalConfig(samples_per_task=2, max_infra_retries=1),
            )
            return [g.group_id async for g in driver.groups()] if stream else await driver.arun()

    assert [g[:2] for g in asyncio.run(main(stream=True))] == ["1-"]
    result = asyncio.run(main(stream=False))
    rows = [r for r in result.samples.to_pylist() if r["group_id"].startswith("0-")]
    assert [(r["ok"], r["error_type"], r["num_errors"], len(r["attempts"])) for r in rows] == [
        (False, "InfrastructureLost", 1, 2)
    ] * 2
    summaries = {r["group_id"][:2]: r for r in result.groups.to_pylist()}
    assert summaries["0-"]["n_failed"] == 2 and summaries["1-"]["rejected"] is None
    assert summaries["0-"]["rejected"] == (
        "lost: sample(s) [0, 1] lost to the infrastructure on every attempt; a resume runs them again"
    )
    assert result.rejected == 1


def test_circuit_breaker_halts_after_consecutive_provider_failures() -> None:
    model = ScriptedModel(default=ProviderError("upstream down", 503))
    config = EvalConfig(samples_per_task=1, max_in_flight=1, breaker=3)
    driver, result = drive(10, model=model, config=config)
    assert result.status == "halted"
    assert result.reason.startswith("circuit breaker: 3 consecutive provider failures")
    assert driver.progress.done == 3 and result.samples.num_rows == 3


def test_stream_yields_a_group_before_the_run_ends() -> None:
    async def main() -> tuple[int, int]:
        async with LocalExecutor() as ex:
            driver = Driver(
                tasks(6),
                ChatHarness(),
                ScriptedModel(default="4"),
                executor=ex,
                config=EvalConfig(samples_per_task=2, max_in_flight=2, stream_buffer=1),
            )
            async with aclosing(driver.groups()) as groups:
                async for group in groups:
                    return driver.progress.done, group.samples.num_rows
        raise AssertionError("no group")

    done, rows = asyncio.run(main())
    assert rows == 2 and done < 12


def test_interrupted_run_resumes_with_every_sample_exactly_once(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "run")
    config = EvalConfig(samples_per_task=3, max_in_flight=4, rows_per_shard=5)

    async def interrupted() -> None:
        async with LocalExecutor() as ex:
            driver = Driver(
                tasks(8), ChatHarness(), ScriptedModel(default="4"), executor=ex, config=config, run_dir=run_dir
            )
            seen = 0
            async with aclosing(driver.groups()) as groups:
                async for _ in groups:
                    seen += 1
                    if seen == 3:
                        break  # the consumer goes away mid-run: in-flight rollouts are cancelled

    asyncio.run(interrupted())
    partial = read_run(run_dir).num_rows
    assert 9 <= partial < 24
    driver, result = drive(8, config=config, run_dir=run_dir, resume=True)
    keys = list(zip(result.samples["group_id"].to_pylist(), result.samples["sample_idx"].to_pylist(), strict=True))
    assert len(keys) == 24 and len(set(keys)) == 24
    assert driver.progress.skipped == partial and driver.progress.done == 24 - partial
    assert result.groups.num_rows == 8


def test_a_run_directory_is_not_overwritten_without_resume(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "run")
    drive(1, run_dir=run_dir)
    with pytest.raises(FileExistsError, match="pass resume=True"):
        drive(1, run_dir=run_dir)


@pytest.mark.ray
def test_eval_of_200_rollouts_on_local_ray(ray_cluster: Any, tmp_path: Any) -> None:
    from rollout_ray._ray.ray_executor import RayExecutor

    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    config = EvalConfig(samples_per_task=4, max_in_flight=64)
    executor = RayExecutor(actors=2, capacity=32)
    driver, result = drive(50, executor=executor, config=config, run_dir=str(tmp_path / "run"))
    assert result.samples.num_rows == 200 and result.groups.num_rows == 50
    assert set(result.samples["ok"].to_pylist()) == {True}


class HangsOnce(ChatHarness):
    """First attempt: report through a FIFO, then hang; once the test drops a marker, answer."""

    def __init__(self, fifo: str, marker: str) -> None:
        super().__init__(retries=0)
        self.fifo, self.marker = fifo, marker

    async def launch(self, ctx: Any) -> Any:
        import os

        if not os.path.exists(self.marker):
            await asyncio.to_thread(Path(self.fifo).write_text, "started")
            await asyncio.Event().wait()
        return await super().launch(ctx)


@pytest.mark.ray
@pytest.mark.slow  # waits for the dead actor's lease to run out
def test_a_killed_rollout_actor_becomes_a_retry_within_seconds(ray_cluster: Any, tmp_path: Any) -> None:
    import os

    from rollout_ray._hosting.node_services import LEASE_SECONDS
    from rollout_ray._ray.calls import NAMESPACE
    from rollout_ray._ray.node_service_actor import SERVICES_PREFIX
    from rollout_ray._ray.ray_executor import RayExecutor

    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    fifo, marker = str(tmp_path / "started"), str(tmp_path / "marker")
    os.mkfifo(fifo)

    async def main() -> Any:
        executor = RayExecutor(actors=1, capacity=4)
        async with executor:
            driver = Driver(
                tasks(1),
                HangsOnce(fifo, marker),
                ScriptedModel(default="4"),
                executor=executor,
                config=EvalConfig(samples_per_task=1, max_infra_retries=1),
            )
            running = asyncio.create_task(driver.arun())
            assert await asyncio.to_thread(Path(fifo).read_text) == "started"
            Path(marker).write_text("")
            dead, executor_owner = executor._pool[0].actor, executor._pool[0].owner
            ray_cluster.kill(dead, no_restart=True)
            async with asyncio.timeout(30):  # never a hang: the lost rollout is retried
                result = await running
            node = ray_cluster.get_runtime_context().get_node_id()
            try:
                services = ray_cluster.get_actor(SERVICES_PREFIX + node, namespace=NAMESPACE)
            except ValueError:  # never started (in-process rollouts need none): nothing to reap
                return result, executor.replaced
            # The dead actor's lease runs out and its session is reaped: bounded, not at once.
            deadline = time.monotonic() + 3 * LEASE_SECONDS
            while await services.load.remote(executor_owner):
                assert time.monotonic() < deadline, "the dead actor's registrations were not reaped"
                await asyncio.sleep(0.2)
            return result, executor.replaced

    result, replaced = asyncio.run(main())
    (row,) = result.samples.to_pylist()
    assert row["ok"] and row["attempt"] == 1 and row["num_errors"] == 0 and replaced == 1
    assert [len(a["errors"]) for a in row["attempts"]] == [1, 0]
    assert result.samples["reward"].to_pylist() == [1.0]


@pytest.mark.parametrize("lazy", [False, True], ids=["list", "generator"])
def test_a_resume_over_a_changed_taskset_is_refused(tmp_path: Path, lazy: bool) -> None:
    """A group is its task's position and key: another task at a stored position is refused,
    whether the taskset is checked before anything runs (a list) or as it is planned."""
    out = str(tmp_path / "run")

    def run(prompts: list[str], resume: bool) -> None:
        taskset = [Echo({"prompt": p}) for p in prompts]

        async def main() -> None:
            async with LocalExecutor() as executor:
                await Driver(
                    iter(taskset) if lazy else taskset,
                    ChatHarness(retries=0),
                    ScriptedModel(default="4"),
                    executor=executor,
                    config=EvalConfig(samples_per_task=2),
                    run_dir=out,
                    resume=resume,
                ).arun()

        asyncio.run(main())

    run(["a", "a", "b"], resume=False)
    run(["a", "a", "b", "c"], resume=True)  # a task appended: the stored ones are where they were
    with pytest.raises(ResumeMismatch, match=r"task 1 is not the task stored at that position \(group 1-"):
        run(["a", "x", "b", "c"], resume=True)
    assert read_run(out, ["reward"]).num_rows == 8


@pytest.mark.parametrize("fails_at", [1, 3])
def test_a_progress_callback_that_raises_fails_the_run_with_its_error_not_a_hang(fails_at: int) -> None:
    """Raised at the first report (rollouts still running) or only at the last (the report at
    the end): ``arun`` raises that error, within a bound, and the callback is not called again."""
    from driver_fakes import Timed

    from conftest import run

    calls = 0

    def display(progress: Any) -> None:
        nonlocal calls
        calls += 1
        if progress.done >= fails_at:
            raise ValueError("display broke")

    async def main() -> Any:
        driver = Driver(
            tasks(3),
            ChatHarness(),
            ScriptedModel(),
            executor=Timed(duration=lambda idx: 1.0 + idx),
            config=EvalConfig(max_in_flight=3),
            on_progress=display,
            progress_every=0,
        )
        return await asyncio.wait_for(driver.arun(), 60)  # the virtual clock: a hang fails at once

    with pytest.raises(ValueError, match="^display broke$"):
        run(main())
    assert calls == fails_at
