"""A live run's control endpoint and status file, in process: a driver with a run directory on
the local executor, its rollouts held in their model call until the test releases them."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rollout_ray._core.model import Model
from rollout_ray._driver import control
from rollout_ray._driver.driver import Driver, EvalConfig, RunResult
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._record.messages import Request, Response
from rollout_ray._record.store import read_run
from rollout_ray.testing import ScriptedHarness, ScriptedModel

from conftest import tasks

BOUND = 30.0
"""Seconds a condition has to come true (a bound, not a wait: polls return as soon as it does)."""


class Barrier(Model):
    """Answers "4" to every call, once ``release`` is set; counts the calls that arrived."""

    shareable = True

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.arrived = 0
        self._inner = ScriptedModel(default="4")

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Response:
        self.arrived += 1
        await self.release.wait()
        return await self._inner.complete(request, model=model, sampling=sampling)


class Ctl:
    """The control endpoint of the run in ``run_dir``, as a client with (or without) its token."""

    def __init__(self, run_dir: Path, http: aiohttp.ClientSession) -> None:
        self.run_dir, self.http = run_dir, http

    async def endpoint(self) -> dict[str, Any]:
        path = self.run_dir / "control.json"
        await until(path.exists)
        return json.loads(path.read_text())

    async def call(
        self, method: str, route: str, body: dict[str, Any] | None = None, *, token: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        info = await self.endpoint()
        headers = {"Authorization": f"Bearer {info['token'] if token is None else token}"}
        async with self.http.request(method, info["url"] + route, json=body, headers=headers) as response:
            return response.status, await response.json()

    async def status(self, query: str = "") -> dict[str, Any]:
        code, body = await self.call("GET", "/status" + query)
        assert code == 200, body
        return body

    async def until_status(self, ok: Callable[[dict[str, Any]], bool], query: str = "") -> dict[str, Any]:
        async with asyncio.timeout(BOUND):
            while not ok(status := await self.status(query)):
                await asyncio.sleep(0.01)
        return status


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(BOUND):
        while not condition():
            await asyncio.sleep(0.01)


def steered(
    run_dir: Path,
    scenario: Callable[[Ctl, Barrier, Driver], Awaitable[None]],
    *,
    n: int = 4,
    max_in_flight: int = 2,
    resume: bool = False,
    samples: int = 1,
    **config: Any,
) -> RunResult:
    """Run ``n`` tasks × ``samples`` into ``run_dir`` while ``scenario`` steers it; the barrier is
    released when the scenario returns."""

    async def main() -> RunResult:
        model = Barrier()
        async with LocalExecutor(runtime="local") as executor, aiohttp.ClientSession() as http:
            driver = Driver(
                tasks(n),
                ScriptedHarness(),
                model,
                executor=executor,
                run_dir=str(run_dir),
                resume=resume,
                config=EvalConfig(samples_per_task=samples, max_in_flight=max_in_flight, **config),
            )
            running = asyncio.create_task(driver.arun())
            try:
                await scenario(Ctl(run_dir, http), model, driver)
            finally:
                model.release.set()
            return await running

    return asyncio.run(main())


def in_call(n: int) -> Callable[[dict[str, Any]], bool]:
    return lambda s: s["phases"]["model call"] == n


def test_status_names_the_rollouts_held_in_their_model_call_and_the_stalled_ones(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    async def scenario(ctl: Ctl, model: Barrier, driver: Driver) -> None:
        seen["held"] = await ctl.until_status(in_call(2))
        seen["stalled"] = await ctl.status("?stall_after=0")

    result = steered(tmp_path / "run", scenario)
    held, stalled = seen["held"], seen["stalled"]
    assert held["state"] == "running" and held["max_in_flight"] == 2
    assert held["progress"]["in_flight"] == 2 and held["progress"]["total"] == 4
    assert sorted(r["task"] for r in held["rollouts"]) == [0, 1]
    assert all(
        r["phase"] == "model call" and len(r["id"]) == 32 and r["label"].endswith("#0") for r in held["rollouts"]
    )
    assert held["stalled"] == 0  # the default bound: minutes, not milliseconds
    assert stalled["stalled"] == 2 and all(r["stalled"] for r in stalled["rollouts"])
    assert result.status == "completed" and result.samples.num_rows == 4


def test_a_wrong_or_missing_token_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    codes: list[int] = []

    async def scenario(ctl: Ctl, model: Barrier, driver: Driver) -> None:
        await ctl.until_status(in_call(2))
        for method, route in (("GET", "/status"), ("POST", "/stop"), ("POST", "/pause")):
            codes.append((await ctl.call(method, route, token="not-the-token"))[0])
        info = await ctl.endpoint()
        async with ctl.http.post(info["url"] + "/stop") as response:  # no token at all
            codes.append(response.status)
        assert (await ctl.status())["state"] == "running"

    result = steered(tmp_path / "run", scenario)
    assert codes == [401, 401, 401, 401]
    assert result.status == "completed" and result.samples.num_rows == 4


def test_status_json_is_fresh_and_the_token_readable_by_its_owner_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control, "STATUS_EVERY", 0.02)
    run_dir = tmp_path / "run"
    seen: dict[str, Any] = {}

    async def scenario(ctl: Ctl, model: Barrier, driver: Driver) -> None:
        await ctl.until_status(in_call(2))
        status = run_dir / "status.json"
        first = json.loads(status.read_text())["updated_at"]
        await until(lambda: json.loads(status.read_text())["updated_at"] > first)  # replaced, never partial
        seen["live"] = json.loads(status.read_text())
        seen["modes"] = {
            name: stat.S_IMODE(os.stat(run_dir / name).st_mode) for name in ("control.json", "status.json")
        }

    steered(run_dir, scenario)
    assert seen["modes"] == {"control.json": 0o600, "status.json": 0o644}
    assert seen["live"]["state"] == "running" and seen["live"]["phases"]["model call"] == 2
    final = json.loads((run_dir / "status.json").read_text())
    assert final["state"] == "completed" and final["progress"]["done"] == 4
    assert not (run_dir / "control.json").exists()  # no live run: ctl says so


def test_cancel_fails_the_rollout_as_cancelled_and_retry_failed_runs_it_again(tmp_path: Path) -> None:
    async def scenario(ctl: Ctl, model: Barrier, driver: Driver) -> None:
        held = await ctl.until_status(in_call(2))
        first = min(held["rollouts"], key=lambda r: r["task"])
        assert await ctl.call("POST", "/cancel", {"rollout": first["id"]}) == (200, {"done": f"cancel {first['id']}"})
        assert (await ctl.call("POST", "/cancel", {"rollout": "nobody"}))[0] == 404

    result = steered(tmp_path / "once", scenario)
    rows = sorted(read_run(result.run_dir, ["task_idx", "ok", "error_type"]).to_pylist(), key=lambda r: r["task_idx"])
    assert rows[0] == {"task_idx": 0, "ok": False, "error_type": "RolloutCancelled"}
    assert all(r["ok"] for r in rows[1:])

    again = steered(tmp_path / "retried", scenario, retry_failed=True)
    rows = read_run(again.run_dir, ["task_idx", "ok", "attempt"]).to_pylist()
    assert all(r["ok"] for r in rows) and {r["task_idx"]: r["attempt"] for r in rows}[0] == 1


def test_requeue_runs_the_rollout_again_without_spending_a_retry(tmp_path: Path) -> None:
    async def scenario(ctl: Ctl, model: Barrier, driver: Driver) -> None:
        held = await ctl.until_status(in_call(2))
        first = min(held["rollouts"], key=lambda r: r["task"])
        assert (await ctl.call("POST", "/requeue", {"rollout": first["label"]}))[0] == 200
        again = await ctl.until_status(
            lambda s: any(r["attempt"] == 2 and r["phase"] == "model call" for r in s["rollouts"])
        )
        assert {r["task"] for r in again["rollouts"]} == {0, 1}
        assert model.arrived == 3

    result = steered(tmp_path / "run", scenario)
    rows = read_run(result.run_dir, ["ok", "attempt", "error_type"]).to_pylist()
    assert all(r["ok"] and r["attempt"] == 0 and r["error_type"] is None for r in rows)


def test_max_in_flight_pause_and_resume_take_effect_while_it_runs(tmp_path: Path) -> None:
    async def scenario(ctl: Ctl, model: Barrier, driver: Driver) -> None:
        await ctl.until_status(in_call(1))
        assert await ctl.call("POST", "/max-in-flight", {"n": 3}) == (200, {"done": "max-in-flight 3"})
        await ctl.until_status(in_call(3))
        assert (await ctl.call("POST", "/max-in-flight", {"n": 0}))[0] == 400
        assert (await ctl.call("POST", "/pause"))[0] == 200
        assert (await ctl.call("POST", "/max-in-flight", {"n": 6}))[0] == 200
        paused = await ctl.status()
        assert paused["state"] == "paused" and paused["phases"]["model call"] == 3 and model.arrived == 3
        assert (await ctl.call("POST", "/resume"))[0] == 200
        await ctl.until_status(in_call(6))

    result = steered(tmp_path / "run", scenario, n=8, max_in_flight=1)
    assert result.status == "completed" and result.samples.num_rows == 8


def test_stop_finishes_what_runs_stores_it_and_a_resume_runs_the_rest(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"

    async def stop(ctl: Ctl, model: Barrier, driver: Driver) -> None:
        await ctl.until_status(in_call(2))
        assert (await ctl.call("POST", "/pause"))[0] == 200  # a paused run stops too
        assert (await ctl.call("POST", "/stop"))[0] == 200
        assert (await ctl.status())["state"] == "stopping"

    stopped = steered(run_dir, stop, n=6)
    assert stopped.status == "halted" and stopped.reason == "stopped by the operator (rollout-ray ctl stop)"
    assert sorted(read_run(str(run_dir), ["task_idx"])["task_idx"].to_pylist()) == [0, 1]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "halted"

    async def nothing(ctl: Ctl, model: Barrier, driver: Driver) -> None:
        pass

    resumed = steered(run_dir, nothing, n=6, resume=True)
    assert resumed.status == "completed"
    assert sorted(read_run(str(run_dir), ["task_idx"])["task_idx"].to_pylist()) == list(range(6))


def test_a_stall_bound_not_finite_or_negative_and_a_max_in_flight_beyond_its_bound_are_refused(tmp_path: Path) -> None:
    async def scenario(ctl: Ctl, model: Barrier, driver: Driver) -> None:
        await ctl.until_status(in_call(2))
        for bad in ("nan", "inf", "-inf", "-1", "1e400", "x"):  # the CLI's --stall-after refuses each
            code, body = await ctl.call("GET", f"/status?stall_after={bad}")
            assert code == 400 and "stall_after" in body["error"], (bad, code, body)
        code, body = await ctl.call("POST", "/max-in-flight", {"n": 10**100})
        assert code == 400 and f"<= {control.MAX_IN_FLIGHT}" in body["error"], body
        assert (await ctl.status())["max_in_flight"] == 2  # unchanged
        # `auto` only gives the bound back to a controller: this run was started with a number.
        code, body = await ctl.call("POST", "/max-in-flight", {"n": "auto"})
        assert code == 409 and "max_in_flight='auto'" in body["error"], body
        assert (await ctl.status())["in_flight_target"] is None
        assert await ctl.call("POST", "/max-in-flight", {"n": control.MAX_IN_FLIGHT}) == (
            200,
            {"done": f"max-in-flight {control.MAX_IN_FLIGHT}"},
        )

    result = steered(tmp_path / "run", scenario)
    assert result.status == "completed" and result.samples.num_rows == 4


def test_a_stop_while_a_group_is_half_started_stores_every_rollout_it_counts(tmp_path: Path) -> None:
    """Issue 28: groups of 2 under max-in-flight 3, so the driver waits for room to start the
    second sample of group 1 when the operator pauses and stops. The stop must not strand the
    group's first sample: counted done (the bar, status.json) but never stored (a group is
    stored whole), then run again by the resume. The admitted group runs whole and is stored."""
    run_dir = tmp_path / "run"

    async def stop(ctl: Ctl, model: Barrier, driver: Driver) -> None:
        await ctl.until_status(in_call(3))  # group 0 whole and group 1's first sample
        assert (await ctl.call("POST", "/max-in-flight", {"n": 3}))[0] == 200
        assert (await ctl.call("POST", "/pause"))[0] == 200
        assert (await ctl.call("POST", "/resume"))[0] == 200
        assert (await ctl.call("POST", "/stop"))[0] == 200

    stopped = steered(run_dir, stop, n=4, samples=2, max_in_flight=3)
    assert stopped.status == "halted"
    stored = sorted(read_run(str(run_dir), ["task_idx"])["task_idx"].to_pylist())
    done = json.loads((run_dir / "status.json").read_text())["progress"]["done"]
    assert (done, stored) == (4, [0, 0, 1, 1])

    async def nothing(ctl: Ctl, model: Barrier, driver: Driver) -> None:
        pass

    resumed = steered(run_dir, nothing, n=4, samples=2, max_in_flight=3, resume=True)
    assert resumed.status == "completed"
    rows = read_run(str(run_dir), ["task_idx", "sample_idx"]).to_pylist()
    assert sorted((r["task_idx"], r["sample_idx"]) for r in rows) == [(t, i) for t in range(4) for i in range(2)]
