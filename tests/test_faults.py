"""The fault-injection suite: kill what rollouts run on, break the model, flood the box.

Each scenario injects one fault, asserts the outcome and a time bound, and adds a row to the
table printed at the end of the session (``pytest_terminal_summary`` in ``conftest.py``):
scenario, what was injected, what recovered, what was lost, seconds. The last test checks
that the suite left nothing behind: no runtime process, no rollout actor, no runtime
directory.

Everything the suite starts carries ``ROLLOUT_RAY_FAULT_SUITE`` in its environment (set here
at import, before the session's Ray starts, so its workers and their programs inherit it):
that is how the last test tells our leftovers from other runs on the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from rollout_ray import (
    ChatHarness,
    OpenAIModel,
    ProviderError,
    Rollout,
    RolloutTimeouts,
    Runtime,
    SimulatedModelConfig,
    SimulatedModelServer,
    Toolset,
    Trace,
    tool,
)
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._errors import CorruptRun, InfrastructureLost
from rollout_ray._harnesses.program import ProgramHarness
from rollout_ray._hosting.executor import Executor
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._hosting.spec import RolloutSpec
from rollout_ray._record.arrow import table_to_traces
from rollout_ray._record.messages import Request, UserMessage
from rollout_ray._record.store import read_manifest, read_run, shard_paths
from rollout_ray._runtimes.guardian import pids_with_marker
from rollout_ray._runtimes.host import HOST_MARKER
from rollout_ray._runtimes.local import RUNTIME_MARKER, LocalRuntime
from rollout_ray._runtimes.sandbox import SandboxRuntime, sandbox_unavailable
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray.testing import Reply, ScriptedModel

from conftest import SLEEPER, Echo, process_alive, tasks, wait_exit

SUITE_MARKER = "ROLLOUT_RAY_FAULT_SUITE"
SUITE = os.environ.setdefault(SUITE_MARKER, uuid.uuid4().hex)
HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "fault_scripts"
REPO = HERE.parent

pytestmark = pytest.mark.faults

HOST_ROOTS: list[str] = []
"""Root directories of the runtime hosts the suite's rollout actors created."""
TEMP_AREAS: list[Path] = []
"""Directories given to subprocesses as TMPDIR: no runtime directory may stay in them."""


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll an external process's effect (a file appearing) with a deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not within {timeout}s"
        await asyncio.sleep(0.01)


def ray_module() -> Any:
    ray = pytest.importorskip("ray")
    for name in (__name__, "conftest"):  # workers cannot import test modules
        ray.cloudpickle.register_pickle_by_value(sys.modules[name])
    return ray


# -- 1. a rollout actor killed mid-segment -----------------------------------------------------


class Gate:
    """A Ray actor: rollouts report (actor pid, rollout id, pid of a process in their runtime)
    and wait until the test opens the gate."""

    def __init__(self) -> None:
        self.arrived: list[tuple[int, str, int]] = []
        self._open = asyncio.Event()
        self._changed = asyncio.Condition()

    async def arrive(self, actor_pid: int, rollout_id: str, runtime_pid: int) -> None:
        async with self._changed:
            self.arrived.append((actor_pid, rollout_id, runtime_pid))
            self._changed.notify_all()
        await self._open.wait()

    async def until(self, n: int) -> list[tuple[int, str, int]]:
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.arrived) >= n)
        return list(self.arrived)

    def open(self) -> None:
        self._open.set()


class Parked(ChatHarness):
    """Starts a background process in its owned runtime, reports to the gate, waits there."""

    def __init__(self, gate: Any) -> None:
        super().__init__(retries=0)
        self.gate = gate

    async def launch(self, ctx: Any) -> Any:
        out = await ctx.runtime.exec(SLEEPER)
        await self.gate.arrive.remote(os.getpid(), ctx.trace.id, int(out.stdout))
        return await super().launch(ctx)


class Watched(Executor):
    """Wraps an executor; ``lost`` is set once ``expect`` rollouts came back lost."""

    def __init__(self, inner: Executor, expect: int) -> None:
        self.inner, self.expect, self.count = inner, expect, 0
        self.lost = asyncio.Event()

    async def set_policy(self, version: int | None, paused: bool) -> None:
        await self.inner.set_policy(version, paused)

    @property
    def max_in_flight(self) -> int | None:
        return self.inner.max_in_flight

    async def run(self, spec: RolloutSpec) -> Trace:
        trace = await self.inner.run(spec)
        if any(e.is_a(InfrastructureLost) for e in trace.errors):
            self.count += 1
            if self.count >= self.expect:
                self.lost.set()
        return trace


async def host_facts(actor: Any) -> dict[str, Any]:
    """Root, guardian pid and pid of a rollout actor's runtime host (recorded for the end)."""
    host = await actor.actor.runtime_actor.remote()
    root, guardian, pid = await host.__ray_call__.remote(lambda h: (h.root, h.guardian_pid(), h.pid()))
    HOST_ROOTS.append(root)
    return {"root": root, "guardian": guardian, "pid": pid}


async def first(awaitable: Any, running: asyncio.Future[Any], *, timeout: float) -> Any:
    """``awaitable``'s result; fails at once if ``running`` ends first (a rollout that never
    reached the gate), or after ``timeout`` seconds."""
    waiter = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait([waiter, running], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if waiter not in done:
        waiter.cancel()
        detail = running.result().samples.to_pylist() if running in done else f"nothing within {timeout}s"
        raise AssertionError(f"the rollouts never all reached the gate: {detail}")
    return waiter.result()


async def stop_gate(ray: Any, gate: Any) -> None:
    ray.kill(gate, no_restart=True)


@pytest.mark.ray
@pytest.mark.parametrize(("how", "retries"), [("SIGKILL", 1), ("ray.kill", 0)])
def test_rollout_actor_killed_mid_segment(ray_cluster: Any, report: Any, how: str, retries: int) -> None:
    ray = ray_module()
    from rollout_ray._ray.ray_executor import RayExecutor

    async def main() -> tuple[Any, list[tuple[int, str, int]], set[str], dict[str, Any], float, int]:
        gate = ray.remote(Gate).options(num_cpus=0, max_concurrency=100).remote()
        executor = RayExecutor(actors=2, capacity=4, runtime="local")  # host pids are followed below
        try:
            async with executor:
                watched = Watched(executor, expect=2)
                driver = Driver(
                    tasks(4),
                    Parked(gate),
                    ScriptedModel(default="4"),
                    executor=watched,  # type: ignore[arg-type]
                    config=EvalConfig(samples_per_task=1, max_infra_retries=retries),
                )
                running = asyncio.ensure_future(driver.arun())
                arrived = await first(gate.until.remote(4), running, timeout=120)
                victim_pid = arrived[0][0]
                pids = [await a.actor.pid.remote() for a in executor._pool]  # type: ignore[union-attr]
                victim = executor._pool[pids.index(victim_pid)]
                assert victim is not None
                host = await host_facts(victim)
                victims = {rid for pid, rid, _ in arrived if pid == victim_pid}
                t0 = time.monotonic()
                if how == "SIGKILL":
                    os.kill(victim_pid, signal.SIGKILL)
                else:
                    ray.kill(victim.actor, no_restart=True)
                async with asyncio.timeout(5):  # the lost rollouts reach the driver within 5 s
                    await watched.lost.wait()
                detected = time.monotonic() - t0
                await gate.open.remote()
                async with asyncio.timeout(30):
                    result = await running
                for actor in executor._pool:
                    if actor is not None:
                        await host_facts(actor)
                return result, arrived, victims, host, detected, executor.replaced
        finally:
            await stop_gate(ray, gate)

    result, arrived, victims, host, detected, replaced = asyncio.run(main())
    rows = {r["rollout_id"]: r for r in result.samples.to_pylist()}
    assert len(rows) == 4 and len(victims) == 2
    siblings = {rid for _, rid, _ in arrived if rid not in victims}
    assert {rid: (rows[rid]["ok"], rows[rid]["attempt"]) for rid in siblings} == {rid: (True, 0) for rid in siblings}
    lost = [r for rid, r in rows.items() if rid not in siblings]
    assert len(lost) == 2 and not victims & rows.keys()  # the lost attempts are not rows
    if retries:
        # The error columns are the stored attempt's; the lost one's error is its history.
        assert [(r["ok"], r["attempt"], r["num_errors"], r["error_type"]) for r in lost] == [(True, 1, 0, None)] * 2
        assert [[len(a["errors"]) for a in r["attempts"]] for r in lost] == [[1, 0]] * 2
        assert replaced == 1
    else:
        assert [(r["ok"], r["attempt"], r["error_type"]) for r in lost] == [(False, 0, "InfrastructureLost")] * 2
        assert replaced == 0
    for trace in table_to_traces(result.samples):
        if trace.id not in siblings:
            assert trace.errors[0].type == "InfrastructureLost"
            assert trace.errors[0].message == "rollout actor died: ActorDiedError"
    # The victim's owned runtimes go with it: the host, its guardian, their processes, files.
    for _, rid, pid in arrived:
        wait_exit(pid, 5.0)
    wait_exit(host["pid"], 5.0)
    wait_exit(host["guardian"], 5.0)
    assert not os.path.exists(host["root"])
    assert detected < 30  # a hang guard: the table prints the time
    report(
        f"1 rollout actor killed (retries={retries})",
        f"{how}, 2 of 4 rollouts on it",
        "2 siblings ok; 2 retried ok" if retries else "2 siblings ok",
        "0" if retries else "2 failed: InfrastructureLost",
        detected,
    )


# -- 2. the runtime actor killed mid tool call --------------------------------------------------


class Box(Toolset):
    name = "box"

    @tool
    async def stall(self, fifo: str, runtime: Runtime) -> str:
        """Run a shell in the runtime that reports its pid, then waits forever."""
        result = await runtime.exec(["sh", "-c", f"echo $$ > {fifo}; exec sleep 1000"])
        return result.stdout

    @tool
    async def echo(self, text: str, runtime: Runtime) -> str:
        """Echo ``text`` from a shell in the runtime."""
        return (await runtime.exec(["echo", text])).stdout.strip()


class UsesBox(Echo):
    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [Box()]


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


@pytest.fixture(scope="module")
def tool_call_kill(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One rollout's runtime actor SIGKILLed while a tool's exec runs in it, then a second
    rollout on the same rollout actor; the facts, for the tests below."""
    ray_module()
    from rollout_ray._ray.rollout_client import RolloutActor

    fifo = str(tmp_path_factory.mktemp("tool-call") / "pid")
    os.mkfifo(fifo)
    stalls = ScriptedModel([Reply(tool_calls=[("stall", {"fifo": fifo})])], default="4")
    echoes = ScriptedModel([Reply(tool_calls=[("echo", {"text": "still here"})])], default="4")

    async def main() -> dict[str, Any]:
        actor = RolloutActor.create(capacity=2, runtime="local")  # the tool's pid is a host pid
        try:
            host = await host_facts(actor)
            spec = RolloutSpec(UsesBox({"prompt": "hi"}), ChatHarness(retries=0), stalls)
            running = asyncio.ensure_future(actor.run(spec))
            async with asyncio.timeout(10):
                pid = int(await asyncio.to_thread(_read, fifo))
            t0 = time.monotonic()
            os.kill(host["pid"], signal.SIGKILL)
            async with asyncio.timeout(5):
                trace = await running
            seconds = time.monotonic() - t0
            async with asyncio.timeout(10):
                after = await actor.run(RolloutSpec(UsesBox({"prompt": "hi"}), ChatHarness(retries=0), echoes))
            return {"trace": trace, "after": after, "pid": pid, "host": host, "seconds": seconds}
        finally:
            await actor.aclose()

    return asyncio.run(main())


@pytest.mark.ray
def test_runtime_actor_killed_mid_tool_call(tool_call_kill: dict[str, Any], report: Any) -> None:
    trace, host = tool_call_kill["trace"], tool_call_kill["host"]
    died = f"InfrastructureLost: runtime {trace.id!r}: its runtime actor died (ActorDiedError)"
    assert [(c.name, c.ok, c.error) for c in trace.tool_calls] == [("stall", False, died)]
    assert trace.num_turns == 1 and len(trace.calls) == 1  # the tool-call turn, once; no answer after
    assert not trace.ok and trace.last_error is not None and trace.last_error.type == "InfrastructureLost"
    wait_exit(tool_call_kill["pid"], 5.0)  # the runtime's processes and files go with its host
    wait_exit(host["guardian"], 5.0)
    assert not os.path.exists(host["root"])
    assert tool_call_kill["seconds"] < 30  # a hang guard
    report(
        "2 runtime actor killed",
        "SIGKILL mid tool call",
        "processes + files gone; lost, so run again",
        "0 failed: InfrastructureLost (retried: ray/test_lost_runtime_actor)",
        tool_call_kill["seconds"],
    )


@pytest.mark.ray
def test_runtime_actor_death_in_a_tool_loses_the_rollout(tool_call_kill: dict[str, Any]) -> None:
    """Its host died, not its box: an infrastructure loss, which the driver and a resume run
    again, not a failure of the task (issue 21 §5)."""
    trace = tool_call_kill["trace"]
    assert not trace.ok and trace.last_error is not None and trace.last_error.is_a(InfrastructureLost)


@pytest.mark.ray
def test_a_rollout_actor_outlives_its_dead_runtime_actor(tool_call_kill: dict[str, Any]) -> None:
    after = tool_call_kill["after"]
    assert [(c.name, c.ok) for c in after.tool_calls] == [("echo", True)], after.tool_calls
    assert after.tool_messages[0].content == "still here"


# -- 3. a worker node removed mid-run -----------------------------------------------------------


@pytest.mark.ray
@pytest.mark.slow
def test_worker_node_removed_mid_run(report: Any, tmp_path: Path) -> None:
    """A two-node ``Cluster`` in a subprocess (one ``ray.init`` per process): see the script."""
    area = tmp_path / "tmp"
    area.mkdir()
    TEMP_AREAS.append(area)
    env = {**os.environ, "TMPDIR": str(area), "RAY_TMPDIR": "/tmp", "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "node_loss.py"), "3", "2"],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    wall = time.monotonic() - t0
    lines = [line for line in done.stdout.splitlines() if line.startswith("FACTS ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    facts = json.loads(lines[-1].removeprefix("FACTS "))
    rows = {r["rollout_id"]: r for r in facts["rows"]}
    keys = [(r["group_id"], r["sample_idx"]) for r in facts["rows"]]
    assert facts["status"] == "completed" and len(keys) == 6 and len(set(keys)) == 6  # all, once each
    on_a = [rid for node, rid in facts["arrived"] if node == facts["node_a"]]
    on_b = [rid for node, rid in facts["arrived"] if node == facts["node_b"]]
    assert len(on_a) == len(on_b) == 3
    assert all(rows[rid]["ok"] and rows[rid]["attempt"] == 0 for rid in on_a)  # node A: unaffected
    assert not set(on_b) & rows.keys()  # node B's attempts were lost...
    retried = [r for r in rows.values() if r["attempt"] == 1]  # ...and retried (max_infra_retries=1)
    assert [(r["ok"], r["num_errors"], r["error_type"]) for r in retried] == [(True, 0, None)] * 3
    assert [[[e["type"] for e in a["errors"]] for a in r["attempts"]] for r in retried] == [
        [["InfrastructureLost"], []]
    ] * 3
    assert facts["replaced"] == 1 and facts["detected"] < 5 and facts["elapsed"] < 30
    assert facts["leftover"] == [] and list(area.iterdir()) == []  # cluster.shutdown() took everything
    report(
        "3 worker node removed",
        "remove_node, 3 of 6 rollouts on it",
        "3 node-A ok; 3 retried ok",
        "0 (6 rows, no duplicate)",
        facts["detected"],
    )
    assert wall < 120


def test_ray_executor_placement_is_one_mapping_or_one_per_actor() -> None:
    pytest.importorskip("ray")
    from rollout_ray._ray.ray_executor import RayExecutor

    with pytest.raises(ValueError, match=r"^actor_options must hold one mapping per actor \(2\), got 1$"):
        RayExecutor(actors=2, actor_options=[{"resources": {"node_a": 0.01}}])


# -- 4. model server faults ---------------------------------------------------------------------


COMPLETION = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)
REQUEST = Request([UserMessage("What is 2 + 2?")])


def answer(status: int, body: str = COMPLETION, **headers: str) -> Callable[[], Any]:
    async def respond() -> web.Response:
        return web.Response(status=status, text=body, content_type="application/json", headers=headers)

    return respond


def hang() -> Callable[[], Any]:
    async def respond() -> web.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return respond


@contextlib.asynccontextmanager
async def provider(*answers: Callable[[], Any]) -> AsyncIterator[tuple[str, list[float]]]:
    """A provider answering each request with the next of ``answers``; yields its base URL
    and the arrival time of each request."""
    script, arrivals = list(answers), []

    async def chat(request: web.Request) -> web.StreamResponse:
        arrivals.append(time.monotonic())
        await request.read()
        return await script.pop(0)()

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1", arrivals
    finally:
        await runner.cleanup()


async def ask(model: OpenAIModel) -> Any:
    try:
        return await model.complete(REQUEST, model=None, sampling={})
    finally:
        await model.aclose()


def test_upstream_retries_transient_errors_with_backoff_and_retry_after(report: Any) -> None:
    async def main() -> tuple[Any, list[float], float]:
        async with provider(answer(503, "{}"), answer(429, "{}", **{"Retry-After": "0.3"}), answer(200)) as (url, at):
            t0 = time.monotonic()
            response = await ask(OpenAIModel(url, retries=2, backoff=0.1, max_backoff=1.0))
            return response, at, time.monotonic() - t0

    response, at, seconds = asyncio.run(main())
    assert response.message.content == "4" and len(at) == 3
    assert 0.05 <= at[1] - at[0] <= 0.1 + 0.1  # backoff 0.1 s, jittered to [0.05, 0.1]
    assert 0.3 <= at[2] - at[1] <= 0.3 + 1.0  # the provider's Retry-After, not a longer backoff (slack for load)
    assert seconds < 10  # a hang guard: the table prints the time
    report("4 upstream retry", "503, then 429 Retry-After 0.3", "1/1 after 2 retries", "0", seconds)


@pytest.mark.parametrize(
    ("script", "status", "requests"),
    [
        ((answer(400, '{"error": {"message": "bad"}}'),), 400, 1),  # an answer: final
        ((answer(200, COMPLETION[:40]),), 502, 1),  # a malformed 200: final, never re-sampled
        ((answer(429, "{}", **{"Retry-After": "60"}),), 429, 1),  # asks for more than max_backoff
        ((answer(502, "{}"),) * 3, 502, 3),  # transient every time: gives up after `retries`
        ((hang(), answer(200)), None, 2),  # the first attempt times out; the second answers
    ],
    ids=["400", "malformed", "retry-after-too-long", "502-exhausted", "timeout-then-ok"],
)
def test_upstream_retries_only_what_is_transient(script: Any, status: int | None, requests: int) -> None:
    async def main() -> tuple[Any, int, float]:
        async with provider(*script) as (url, at):
            t0 = time.monotonic()
            try:
                outcome = await ask(OpenAIModel(url, timeout=0.3, retries=2, backoff=0.01, max_backoff=1.0))
            except ProviderError as e:
                outcome = e
            return outcome, len(at), time.monotonic() - t0

    outcome, seen, seconds = asyncio.run(main())
    assert seen == requests and seconds < 15  # a hang guard
    if status is None:
        assert outcome.message.content == "4"
    else:
        assert isinstance(outcome, ProviderError) and outcome.status_code == status, outcome


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections for as long as the block runs: bound and not
    listening, so no other process can take it meanwhile (a port closed and handed on may be
    bound by another test's server before the model connects: one answered 401 here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_upstream_unreachable_is_retried_then_a_503() -> None:
    async def main() -> tuple[BaseException, float]:
        t0 = time.monotonic()
        with pytest.raises(ProviderError) as err:
            with refused_port() as port:
                await ask(OpenAIModel(f"http://127.0.0.1:{port}/v1", retries=2, backoff=0.01))
        return err.value, time.monotonic() - t0

    error, seconds = asyncio.run(main())
    assert error.status_code == 503 and str(error).startswith("cannot reach the model at http://127.0.0.1:")  # type: ignore[attr-defined]
    assert seconds < 10  # a hang guard: the table prints the time
    with pytest.raises(ValueError, match=r"^`retries` must be >= 0, got -1$"):
        OpenAIModel("http://127.0.0.1:1/v1", retries=-1)


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """In-process runtimes (``LocalExecutor``'s) make their directories under ``tmp_path``."""
    import tempfile

    area = tmp_path / "tmp"
    area.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(area))
    TEMP_AREAS.append(area)
    return area


def test_simulated_model_faults_are_retried_or_recorded(report: Any, private_tmp: Path) -> None:
    faults = SimulatedModelConfig(ttft=0.0, rate_429=0.15, rate_5xx=0.15, rate_timeout=0.05, rate_malformed=0.1, seed=3)

    async def main() -> tuple[Any, Any, float]:
        async with SimulatedModelServer(faults) as server, LocalExecutor() as executor:
            model = OpenAIModel(server.base_url, timeout=2.0, retries=4, backoff=0.01, max_backoff=0.05)  # type: ignore[arg-type]
            driver = Driver(
                tasks(40),
                ChatHarness(retries=0),
                model,
                executor=executor,
                config=EvalConfig(samples_per_task=1, max_in_flight=40),
            )
            t0 = time.monotonic()
            result = await driver.arun()
            seconds = time.monotonic() - t0
            await model.aclose()
            return result, server.stats, seconds

    result, stats, seconds = asyncio.run(main())
    transient = stats.by_fault["429"] + stats.by_fault["5xx"] + stats.by_fault["timeout"]
    assert transient > 0 and stats.by_fault["malformed"] > 0
    assert stats.requests == 40 + transient  # each transient fault: exactly one more attempt
    traces = table_to_traces(result.samples)
    failed = [t for t in traces if not t.ok]
    assert len(failed) == stats.by_fault["malformed"]  # a malformed answer is final, never re-sampled
    assert {(t.last_error.type, t.last_error.status_code) for t in failed} == {("ProviderError", 502)}  # type: ignore[union-attr]
    assert all(t.num_turns == 1 for t in traces if t.ok) and result.status == "completed"
    faults = ", ".join(f"{n}×{k}" for k, n in sorted(stats.by_fault.items()))
    report(
        "4 simulated model faults",
        faults,
        f"{40 - len(failed)}/40 ok, {transient} retries",
        f"{len(failed)} ProviderError 502 (malformed)",
        seconds,
    )


def test_model_server_down_trips_the_circuit_breaker(report: Any, private_tmp: Path) -> None:
    async def main() -> tuple[Any, Any, float]:
        with refused_port() as port:
            return await run(OpenAIModel(f"http://127.0.0.1:{port}/v1", retries=1, backoff=0.01))

    async def run(model: OpenAIModel) -> tuple[Any, Any, float]:
        try:
            async with LocalExecutor() as executor:
                driver = Driver(
                    tasks(20),
                    ChatHarness(retries=0),
                    model,
                    executor=executor,
                    config=EvalConfig(samples_per_task=1, max_in_flight=1, breaker=3),
                )
                t0 = time.monotonic()
                result = await driver.arun()
                return driver, result, time.monotonic() - t0
        finally:
            await model.aclose()  # its connection pool, else an unclosed-session warning at GC

    driver, result, seconds = asyncio.run(main())
    assert result.status == "halted" and driver.progress.done == 3 and result.samples.num_rows == 3
    assert result.reason.startswith(
        "circuit breaker: 3 consecutive provider failures (last: cannot reach the model at http://127.0.0.1:"
    )
    assert seconds < 30  # a hang guard: the table prints the time
    report(
        "4 model server down",
        "connection refused, 20 scheduled",
        "halted by breaker=3",
        "3 failed, 17 not started",
        seconds,
    )


# -- 5. programs that hang, fork or flood -------------------------------------------------------


IGNORES_TERM = """
import os, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = os.fork()
if child == 0:
    os.setsid()  # escapes the process group; SIGTERM stays ignored
    while True:
        signal.pause()
with open(sys.argv[1], "w") as f:
    f.write(f"{os.getpid()} {child}")
while True:
    signal.pause()
"""

FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""


async def run_program(
    command: list[str], runtime_factory: Callable[[str], Any], agent: float = 1.0, **kwargs: Any
) -> tuple[Trace, float]:
    async with HTTPInterception() as proxy:
        rollout = Rollout(
            Echo({"prompt": "hi"}),
            ProgramHarness(command, **kwargs),
            model=ScriptedModel(default="4"),
            interception=proxy,
            runtime_factory=runtime_factory,
            timeouts=RolloutTimeouts(agent=agent),
        )
        t0 = time.monotonic()
        trace = await rollout.run()
        return trace, time.monotonic() - t0


def test_program_ignoring_sigterm_is_killed_at_the_agent_deadline(report: Any, tmp_path: Path) -> None:
    fifo = str(tmp_path / "pids")
    os.mkfifo(fifo)

    async def main() -> tuple[Trace, float, list[int]]:
        pids = asyncio.ensure_future(asyncio.to_thread(_read, fifo))
        trace, seconds = await run_program(
            [sys.executable, "-c", IGNORES_TERM, fifo], lambda name: LocalRuntime(name, root=str(tmp_path))
        )
        async with asyncio.timeout(1):
            return trace, seconds, [int(p) for p in (await pids).split()]

    trace, seconds, pids = asyncio.run(main())
    assert [(e.type, e.message) for e in trace.errors] == [
        ("HarnessError", "agent timeout: rollout exceeded its 1s budget")
    ]
    assert len(pids) == 2 and not [p for p in pids if process_alive(p)]  # the whole tree, setsid included
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("rollout-ray-")]
    assert 1.0 <= seconds < 30  # the deadline, then no hang
    report(
        "5 hung program",
        "ignores SIGTERM, setsid child",
        "tree killed at deadline 1 s",
        "1 HarnessError (agent timeout)",
        seconds,
    )


@pytest.mark.skipif(sandbox_unavailable() is not None, reason=f"no sandbox: {sandbox_unavailable()}")
def test_fork_bomb_is_bounded_by_the_sandbox_and_killed(report: Any, tmp_path: Path) -> None:
    made: list[SandboxRuntime] = []

    def sandbox(name: str) -> SandboxRuntime:
        made.append(SandboxRuntime(name, root=str(tmp_path), pids_limit=32))
        return made[-1]

    trace, seconds = asyncio.run(run_program([sys.executable, "-c", FORK_BOMB], sandbox))
    assert [(e.type, e.message) for e in trace.errors] == [
        ("HarnessError", "agent timeout: rollout exceeded its 1s budget")
    ]
    (runtime,) = made
    assert runtime.stopped and pids_with_marker(RUNTIME_MARKER, runtime._token) == []
    assert runtime._cgroups is not None and not any(os.path.exists(p) for p in runtime._cgroups.procs_files)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("rollout-ray-")]
    assert seconds < 40  # a hang guard
    report(
        "5 fork bomb",
        "SandboxRuntime pids_limit=32",
        "bounded, killed at deadline 1 s",
        "1 HarnessError (agent timeout)",
        seconds,
    )


def test_output_flood_is_capped(report: Any, tmp_path: Path) -> None:
    flood = ["sh", "-c", "head -c 20000000 /dev/zero | tr '\\0' x; exit 3"]
    trace, seconds = asyncio.run(
        run_program(flood, lambda name: LocalRuntime(name, root=str(tmp_path)), agent=10.0, max_output=1000)
    )
    (error,) = trace.errors
    assert error.type == "HarnessError" and error.message == "harness 'program' exited 3: " + "x" * 1000
    assert seconds < 50  # a hang guard
    report("5 output flood", "20 MB, max_output=1000", "drained, 1000 B kept", "1 HarnessError (exit 3)", seconds)


# -- 6. the driver killed mid-run, then resumed -------------------------------------------------


@pytest.fixture(scope="module")
def killed_eval(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``rollout-ray eval`` (local executor) SIGKILLed once its first shard is on disk. The
    runtime directories it left are recorded, then removed (they are the test's to check)."""
    base = tmp_path_factory.mktemp("killed-eval")
    area, out = base / "tmp", base / "run"
    area.mkdir()
    TEMP_AREAS.append(area)
    env = {**os.environ, "TMPDIR": str(area)}
    command = [
        sys.executable,
        "-m",
        "rollout_ray",
        "eval",
        str(SCRIPTS / "sharded_arith.py"),
        "--executor",
        "local",
        "--out",
        str(out),
        "--limit",
        "12",
        "--samples",
        "2",
        "--sim-ttft",
        "0.1",
    ]

    async def kill_after_first_shard() -> int:
        with subprocess.Popen(
            command, env=env, cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        ) as first:
            try:
                await until(lambda: any((out / "shards").glob("part-*.parquet")), 30, "a first shard")
            finally:
                first.send_signal(signal.SIGKILL)  # by pid: only the process we started
        return first.returncode

    code = asyncio.run(kill_after_first_shard())

    async def cleaned() -> None:  # the runtimes' guardian outlives the driver and cleans up
        with contextlib.suppress(AssertionError):
            await until(lambda: not any(area.glob("rollout-ray-*")), 5, "the guardian's cleanup")

    asyncio.run(cleaned())
    leaked = sorted(p.name for p in area.glob("rollout-ray-*"))
    for name in leaked:
        shutil.rmtree(area / name)
    return {"code": code, "out": out, "env": env, "command": command, "leaked": leaked}


def test_driver_killed_mid_run_resumes_exactly_once(report: Any, killed_eval: dict[str, Any]) -> None:
    out = killed_eval["out"]
    assert killed_eval["code"] == -signal.SIGKILL
    partial = read_run(out)
    assert 0 < partial.num_rows < 24  # killed midway
    t0 = time.monotonic()
    resumed = subprocess.run(
        [*killed_eval["command"], "--resume"],
        env=killed_eval["env"],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    seconds = time.monotonic() - t0
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    table = read_run(out)
    keys = list(zip(table["group_id"].to_pylist(), table["sample_idx"].to_pylist(), strict=True))
    assert len(keys) == 24 and len(set(keys)) == 24  # 0 lost, 0 duplicated
    assert set(table["run_id"].to_pylist()) == {read_manifest(out).run_id}
    assert set(partial["rollout_id"].to_pylist()) <= set(table["rollout_id"].to_pylist())  # kept, not redone
    assert seconds < 30
    report(
        "6 driver killed, resumed",
        f"SIGKILL eval at {partial.num_rows}/24 stored",
        f"{24 - partial.num_rows}/24 redone on --resume",
        "0 lost, 0 duplicated",
        seconds,
    )


def test_a_killed_local_driver_leaves_no_runtime_directories(killed_eval: dict[str, Any]) -> None:
    assert killed_eval["leaked"] == []


# -- 7. a shard truncated on disk ---------------------------------------------------------------


class Counting(LocalExecutor):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def run(self, spec: RolloutSpec) -> Trace:
        self.calls += 1
        return await super().run(spec)


def test_a_truncated_shard_is_refused_loudly_and_never_streamed(report: Any, private_tmp: Path, tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    config = EvalConfig(samples_per_task=2, rows_per_shard=2, max_in_flight=1)

    async def drive(resume: bool) -> tuple[list[Any], int]:
        executor, groups = Counting(), []
        async with executor:
            driver = Driver(
                tasks(3),
                ChatHarness(),
                ScriptedModel(default="4"),
                executor=executor,
                config=config,
                run_dir=run_dir,
                resume=resume,
            )
            async for group in driver.groups():
                groups.append(group)
        return groups, executor.calls

    asyncio.run(drive(False))
    shards = shard_paths(run_dir)
    bad = shards[1]
    os.truncate(bad, bad.stat().st_size // 2)
    t0 = time.monotonic()
    with pytest.raises(CorruptRun, match=r"^shard .*part-00001\.parquet is truncated or corrupt") as err:
        read_run(run_dir)
    assert err.value.path == bad
    streamed: list[Any] = []

    async def resume() -> None:
        groups, calls = await drive(True)
        streamed.extend(groups)
        assert calls == 0

    with pytest.raises(CorruptRun) as err:  # the resume refuses: nothing scheduled or streamed
        asyncio.run(resume())
    seconds = time.monotonic() - t0
    assert err.value.path == bad and streamed == []
    assert shard_paths(run_dir) == shards  # and nothing written
    report(
        "7 truncated shard",
        "shard 2 of 3 cut in half",
        "read + resume refuse: CorruptRun",
        "0 rows streamed or written",
        seconds,
    )


# -- 8. nothing left behind ---------------------------------------------------------------------


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _leftover_processes() -> list[str]:
    """This suite's runtime programs and guardians still running: a runtime's environment
    is an allow-list (the suite's marker does not reach its programs), so a runtime program
    is found by its runtime marker and its working directory in one of the suite's places."""
    places = tuple(str(p) for p in (*HOST_ROOTS, *TEMP_AREAS))
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        env, command = _environ(pid), _cmdline(pid)
        if env.get(SUITE_MARKER) == SUITE and "_runtimes/guardian.py" in command:
            ours = True
        elif RUNTIME_MARKER in env or HOST_MARKER in env:
            try:
                ours = os.readlink(f"/proc/{pid}/cwd").startswith(places) if places else False
            except OSError:
                ours = False
        else:
            ours = False
        if ours and process_alive(pid):
            found.append(f"{pid}: {command[:200]}")
    return found


def _leftover_dirs() -> list[str]:
    dirs = [r for r in HOST_ROOTS if os.path.exists(r)]
    for area in TEMP_AREAS:
        dirs += [str(p) for p in area.glob("rollout-ray-*")] if area.exists() else []
    return dirs


def _live_rollout_actors() -> list[str]:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return []
    from ray._private import state

    services = ("_NodeServiceActor",)  # shared by every driver of the session, by design
    return [
        f"{info.get('ActorClassName')} {actor_id}"
        for actor_id, info in state.actors().items()
        if info.get("State") in ("ALIVE", "PENDING_CREATION", "RESTARTING")
        and info.get("ActorClassName") not in services
    ]


def test_the_suite_leaves_nothing_behind(report: Any) -> None:
    """Last in the file: no runtime process, rollout actor or runtime directory of ours."""

    async def settle() -> float:
        t0 = time.monotonic()
        # Guardians clean up after their host dies: observed, with a deadline.
        await until(
            lambda: not _leftover_processes() and not _leftover_dirs() and not _live_rollout_actors(), 10, "cleanup"
        )
        return time.monotonic() - t0

    try:
        seconds = asyncio.run(settle())
    except AssertionError:
        pytest.fail(
            f"left behind: processes {_leftover_processes()}, dirs {_leftover_dirs()}, actors {_live_rollout_actors()}"
        )
    report(
        "8 leftovers",
        f"{len(HOST_ROOTS)} hosts, {len(TEMP_AREAS)} temp dirs checked",
        "-",
        "0 processes, actors, dirs",
        seconds,
    )
