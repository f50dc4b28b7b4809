"""The hang-injection suite (issue 24 §2): one hang per boundary a rollout waits on, each of
which must become a failed or retried rollout, or a clear halt with the reason — never a
silent wait.

Each scenario runs a real run (a ``Driver``), makes one thing it waits on hang, and adds a
row to the table printed at the end of the session: what hung, what the framework made of it,
seconds from the hang to that outcome, what the run showed meanwhile, rollouts lost (rows
missing from the run) and what was left behind (connections, processes, threads, actors).

"What the run showed meanwhile" is ``meanwhile(driver)``: what ``rollout-ray ctl RUN status``
shows (``Driver.live_status``), read once the hang holds and before it is detected.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pytest

from rollout_ray import ChatHarness, OpenAIModel, Task, Toolset, Trace, reward, tool
from rollout_ray._driver.bounded_call import still_running
from rollout_ray._driver.driver import Driver, EvalConfig, RunResult
from rollout_ray._harnesses.program import ProgramHarness
from rollout_ray._hosting.executor import Executor
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._hosting.spec import RolloutSpec
from rollout_ray.testing import Reply, ScriptedModel

from conftest import process_alive, wait_exit

pytestmark = pytest.mark.faults

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


# -- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    scenario: str
    injected: str
    outcome: str
    detected: float | None
    """Seconds from the hang to the framework's outcome (``None``: nothing had to be)."""
    meanwhile: str
    lost: int
    leftovers: int


ROWS: list[Row] = []


class _Table:
    """Prints ``ROWS`` at the end of the session (registered by the fixture below)."""

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not ROWS:
            return
        header = ("scenario", "injected", "became", "detected", "run showed meanwhile", "lost", "left")
        cells = [
            header,
            *[
                (
                    r.scenario,
                    r.injected,
                    r.outcome,
                    "-" if r.detected is None else f"{r.detected:.2f}s",
                    r.meanwhile,
                    str(r.lost),
                    str(r.leftovers),
                )
                for r in ROWS
            ],
        ]
        widths = [max(len(row[k]) for row in cells) for k in range(len(header))]
        terminalreporter.section("hang injection")
        for n, row in enumerate(cells):
            terminalreporter.write_line("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
            if n == 0:
                terminalreporter.write_line("  ".join("-" * w for w in widths))


@pytest.fixture(scope="module", autouse=True)
def hang_table(request: pytest.FixtureRequest) -> None:
    plugins = request.config.pluginmanager
    if not plugins.has_plugin("rollout-ray-hang-table"):
        plugins.register(_Table(), "rollout-ray-hang-table")


async def meanwhile(driver: Driver) -> str:
    """What ``rollout-ray ctl RUN status`` shows of the run now (``Driver.live_status``)."""
    return status_line(await driver.live_status())


def status_line(status: dict[str, Any]) -> str:
    """A ``ctl status`` answer in a table cell: phases in flight, the oldest, stalled, done."""
    phases = ", ".join(f"{n} {phase}" for phase, n in status["phases"].items() if n) or "nothing in flight"
    oldest = status["rollouts"][0] if status["rollouts"] else None
    age = f"; oldest {oldest['age']:.1f}s in {oldest['phase']}" if oldest else ""
    p = status["progress"]
    return f"ctl status: {phases}{age}; stalled {status['stalled']}; done {p['done']}/{p['total']}"


def report(row: Row) -> None:
    assert row.lost == 0 and row.leftovers == 0, row
    ROWS.append(row)


# -- helpers ------------------------------------------------------------------------------------


class Timed(Executor):
    """Wraps an executor; records when each trace came back, and the trace."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.returned: list[tuple[float, Trace]] = []

    async def run(self, spec: RolloutSpec) -> Trace:
        trace = await self.inner.run(spec)
        self.returned.append((time.monotonic(), trace))
        return trace

    async def set_policy(self, version: int | None, paused: bool) -> None:
        await self.inner.set_policy(version, paused)

    def statistics(self) -> dict[str, Any]:
        return self.inner.statistics()

    async def live(self) -> dict[str, Any]:
        return await self.inner.live()

    @property
    def max_in_flight(self) -> int | None:
        return self.inner.max_in_flight


class Answers(Task):
    @reward
    def said_four(self, trace: Trace) -> float:
        return float(trace.last_reply == "4")


def tasks(n: int) -> list[Answers]:
    return [Answers({"idx": i, "prompt": f"question {i}"}) for i in range(n)]


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll a condition another task or process brings about, with a deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not within {timeout}s"
        await asyncio.sleep(0.01)


class HangingServer:
    """A loopback TCP server that reads one HTTP request per connection, then answers the
    status line and headers and never the body (``"headers"``), or nothing (``"silent"``),
    until the client hangs up. ``open`` counts the connections still open."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.open = 0
        self.arrivals: list[float] = []
        self.arrived = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> HangingServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            await reader.readexactly(length)
            self.arrivals.append(time.monotonic())
            self.arrived.set()
            if self.mode == "headers":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n")
                await writer.drain()
            while await reader.read(1 << 16):  # until the client hangs up
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


def first_outcome(timed: Timed, since: float) -> float:
    """Seconds from ``since`` (the hang) to the first trace that came back."""
    assert timed.returned, "no trace came back"
    return timed.returned[0][0] - since


def lost(result: RunResult, scheduled: int) -> int:
    return scheduled - result.samples.num_rows


def outcomes(samples: pa.Table) -> str:
    rows = samples.to_pylist()
    failed = [r for r in rows if not r["ok"]]
    kinds = sorted({f"{r['error_type']}" for r in failed})
    retried = sum(r["attempt"] > 0 for r in rows)
    text = f"{len(rows) - len(failed)} ok, {len(failed)} failed" + (f" ({', '.join(kinds)})" if kinds else "")
    return text + (f", {retried} retried" if retried else "")


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """In-process runtimes (``LocalExecutor``'s) make their directories here."""
    import tempfile

    area = tmp_path / "tmp"
    area.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(area))
    return area


# -- 1, 2. the model server ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "injected"),
    [
        ("headers", "model server: headers, then never the body"),
        ("silent", "model server: accepts, never answers"),
    ],
    ids=["headers-no-body", "accepts-never-answers"],
)
def test_a_model_server_that_hangs_fails_the_rollout_as_a_provider_error(
    mode: str, injected: str, private_tmp: Path
) -> None:
    async def main() -> tuple[RunResult, float, str, int]:
        async with HangingServer(mode) as server, LocalExecutor() as inner:
            timed = Timed(inner)
            model = OpenAIModel(server.url + "/v1", name="m", timeout=0.5, retries=1, backoff=0.01)
            driver = Driver(
                tasks(2),
                ChatHarness(retries=0),
                model,
                executor=timed,
                config=EvalConfig(samples_per_task=1, max_in_flight=2),
            )
            running = asyncio.ensure_future(driver.arun())
            async with asyncio.timeout(10):
                await server.arrived.wait()
            seen = await meanwhile(driver)
            async with asyncio.timeout(30):
                result = await running
            await model.aclose()
            await until(lambda: server.open == 0, 5, "the model's connections to close")
            return result, first_outcome(timed, server.arrivals[0]), seen, server.open

    result, detected, seen, still_open = asyncio.run(main())
    rows = result.samples.to_pylist()
    assert [(r["ok"], r["error_type"], r["error_message"]) for r in rows] == [
        (False, "ProviderError", "model request timed out after 0.5s")
    ] * 2
    assert result.status == "completed" and 0.9 <= detected < 10
    report(
        Row(
            f"model {mode}",
            injected,
            "2 failed: ProviderError 504 (timeout 0.5s, 1 retry)",
            detected,
            seen,
            lost(result, 2),
            still_open,
        )
    )


# -- 3. a tool server ----------------------------------------------------------------------------


def test_a_tool_server_that_never_answers_fails_the_call_not_the_rollout(private_tmp: Path) -> None:
    async def main() -> tuple[RunResult, float, str, int]:
        async with HangingServer("silent") as tools_server, LocalExecutor() as inner:

            class Lookup(Toolset):
                name = "lookup"
                call_timeout = 0.5

                @tool
                async def fetch(self, key: str) -> str:
                    """Fetch ``key`` from the tool server (which never answers)."""
                    async with aiohttp.ClientSession() as session:  # no timeout of its own
                        async with session.get(f"{tools_server.url}/{key}") as response:
                            return await response.text()

            class UsesLookup(Answers):
                @classmethod
                def toolsets(cls, config: Any) -> list[Any]:
                    return [Lookup()]

            timed = Timed(inner)
            model = ScriptedModel([Reply(tool_calls=[("fetch", {"key": "x"})])], default="4")
            driver = Driver(
                [UsesLookup({"prompt": "look x up"})],
                ChatHarness(retries=0),
                model,
                executor=timed,
                config=EvalConfig(samples_per_task=1),
            )
            running = asyncio.ensure_future(driver.arun())
            async with asyncio.timeout(10):
                await tools_server.arrived.wait()
            seen = await meanwhile(driver)
            async with asyncio.timeout(30):
                result = await running
            await until(lambda: tools_server.open == 0, 5, "the tool's connection to close")
            detected = first_outcome(timed, tools_server.arrivals[0])
            ((_, trace),) = timed.returned
            assert [(c.name, c.ok, c.error) for c in trace.tool_calls] == [
                ("fetch", False, "tool 'fetch' timed out after 0.5s")
            ]
            return result, detected, seen, tools_server.open

    result, detected, seen, still_open = asyncio.run(main())
    (row,) = result.samples.to_pylist()
    assert (row["ok"], row["reward"], row["num_tool_calls"]) == (True, 1.0, 1)  # the agent went on
    assert 0.4 <= detected < 10
    report(
        Row(
            "tool server silent",
            "a tool's server accepts, never answers",
            "the call failed (timeout 0.5s), the agent went on: 1 ok",
            detected,
            seen,
            lost(result, 1),
            still_open,
        )
    )


# -- 4. a program that ignores SIGTERM -----------------------------------------------------------


IGNORES_TERM = """
import os, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = os.fork()
if child == 0:
    os.setsid()  # escapes the process group; SIGTERM stays ignored
    while True:
        signal.pause()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {child}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    signal.pause()
"""


def test_a_program_that_ignores_sigterm_is_killed_with_its_tree(private_tmp: Path, tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"

    async def main() -> tuple[RunResult, float, str, list[int]]:
        async with LocalExecutor(runtime="local") as inner:  # host pids, to follow them here
            timed = Timed(inner)
            harness = ProgramHarness([sys.executable, "-c", IGNORES_TERM, str(pids_file)], timeout=1.0)
            driver = Driver(
                tasks(1), harness, ScriptedModel(default="4"), executor=timed, config=EvalConfig(samples_per_task=1)
            )
            running = asyncio.ensure_future(driver.arun())
            await until(pids_file.exists, 10, "the program to start")
            started = time.monotonic()
            seen = await meanwhile(driver)
            async with asyncio.timeout(30):
                result = await running
            return result, first_outcome(timed, started), seen, [int(p) for p in pids_file.read_text().split()]

    result, detected, seen, pids = asyncio.run(main())
    (row,) = result.samples.to_pylist()
    assert (row["ok"], row["error_type"]) == (False, "HarnessError")
    assert row["error_message"].startswith("harness 'program' timed out after 1s")
    for pid in pids:
        wait_exit(pid, 5.0)
    left = [p for p in pids if process_alive(p)] + [p.name for p in private_tmp.iterdir()]
    assert detected < 10
    report(
        Row(
            "program ignores SIGTERM",
            "SIGTERM ignored, a setsid child",
            "1 failed: HarnessError (its 1s timeout)",
            detected,
            seen,
            lost(result, 1),
            len(left),
        )
    )


# -- 5. a judge that never returns ---------------------------------------------------------------


def test_a_judge_that_never_returns_fails_its_groups_and_the_run_goes_on(private_tmp: Path) -> None:
    release = threading.Event()
    seen: list[str] = []
    hung_at: list[float] = []

    async def main() -> tuple[list[Any], float, int]:
        async with LocalExecutor() as inner:
            timed = Timed(inner)

            def judge(group: pa.Table) -> dict[str, list[float]]:
                hung_at.append(time.monotonic())
                # the driver's loop waits inside this call (up to judge_timeout): ctl status
                # answers once it returns, so the table shows the progress the loop left
                p = driver.progress
                seen.append(f"(loop in the judge) in flight {p.in_flight}, done {p.done}/{p.total}")
                release.wait()  # "forever": until the test lets it go, after the run
                return {}

            driver = Driver(
                tasks(2),
                ChatHarness(retries=0),
                ScriptedModel(default="4"),
                executor=timed,
                judge=judge,
                config=EvalConfig(samples_per_task=2, max_in_flight=1, judge_timeout=0.5),
            )
            groups, first = [], 0.0
            async with asyncio.timeout(30):
                async for group in driver.groups():
                    first = first or time.monotonic()
                    groups.append(group)
            return groups, first - hung_at[0], still_running()

    try:
        groups, detected, hanging = asyncio.run(main())
    finally:
        release.set()
    ids = [g.group_id for g in groups]
    errors = [g.summary["judge_error"][0].as_py() for g in groups]
    assert len(groups) == 2 and hanging == 1
    assert errors[0] == f"CallTimeout: the judge on group {ids[0]!r} did not return within 0.5s"
    assert errors[1].startswith(
        f"CallTimeout: the judge on group {ids[1]!r}: not called, it still runs the judge on group {ids[0]!r}"
    )
    rows = [r for g in groups for r in g.samples.to_pylist()]
    assert len(rows) == 4 and all(r["ok"] for r in rows)
    asyncio.run(until(lambda: still_running() == 0, 5, "the judge's thread to end once released"))
    assert 0.5 <= detected < 10
    report(
        Row(
            "judge never returns",
            "the group judge blocks forever",
            "judge_error on its 2 groups; 4 rows ok",
            detected,
            seen[0],
            4 - len(rows),
            still_running(),
        )
    )


# -- 6. a rollout actor frozen -------------------------------------------------------------------


class FreezesOnce(ChatHarness):
    """The first attempt of each task writes its actor's pid to a marker and waits; later
    attempts answer."""

    def __init__(self, folder: str) -> None:
        super().__init__(retries=0)
        self.folder = folder

    async def launch(self, ctx: Any) -> Any:
        marker = os.path.join(self.folder, f"task-{ctx.data.idx}")
        if not os.path.exists(marker):
            with open(marker + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(marker + ".tmp", marker)
            await asyncio.Event().wait()  # frozen from outside meanwhile
        return await super().launch(ctx)


@pytest.mark.ray
@pytest.mark.slow
def test_a_frozen_rollout_actor_is_killed_and_its_rollouts_retried(ray_cluster: Any, tmp_path: Path) -> None:
    ray = ray_cluster
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import it
    from rollout_ray._ray.ray_executor import RayExecutor

    async def main() -> tuple[RunResult, float, str, list[int]]:
        inner = RayExecutor(actors=1, capacity=2, probe_interval=0.2, probe_timeout=1.0)
        async with inner:
            timed = Timed(inner)
            driver = Driver(
                tasks(2),
                FreezesOnce(str(tmp_path)),
                ScriptedModel(default="4"),
                executor=timed,
                config=EvalConfig(samples_per_task=1, max_infra_retries=1),
            )
            running = asyncio.ensure_future(driver.arun())
            markers = [tmp_path / "task-0", tmp_path / "task-1"]
            await until(lambda: all(m.exists() for m in markers), 30, "both first attempts to start")
            (pid,) = {int(m.read_text()) for m in markers}
            os.kill(pid, signal.SIGSTOP)  # hung, not dead: Ray alone would wait on it forever
            frozen = time.monotonic()
            seen = await meanwhile(driver)
            async with asyncio.timeout(60):
                result = await running
            pids = [pid, *[await a.actor.pid.remote() for a in inner._pool if a is not None]]
        return result, first_outcome(timed, frozen), seen, pids

    result, detected, seen, pids = asyncio.run(main())
    rows = result.samples.to_pylist()
    assert [(r["ok"], r["attempt"], r["reward"]) for r in rows] == [(True, 1, 1.0)] * 2
    assert [[[e["type"] for e in a["errors"]] for a in r["attempts"]] for r in rows] == [
        [["InfrastructureLost"], []]
    ] * 2
    for pid in pids:  # the frozen actor (killed though stopped) and its replacement (stopped with the pool)
        wait_exit(pid, 10.0)
    assert 1.0 <= detected < 10
    report(
        Row(
            "rollout actor frozen",
            "SIGSTOP of the actor mid-rollout",
            f"probe timed out (1s), killed; {outcomes(result.samples)}",
            detected,
            seen,
            lost(result, 2),
            sum(process_alive(p) for p in pids),
        )
    )


@pytest.mark.ray
@pytest.mark.slow
def test_a_frozen_rollout_actor_used_without_an_executor_fails_its_rollouts(ray_cluster: Any, tmp_path: Path) -> None:
    """``RolloutActor.run`` alone (no executor, so no probe): its channel's own watchdog."""
    ray = ray_cluster
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    from ray.exceptions import RayActorError

    from rollout_ray._ray.rollout_client import RolloutActor

    async def main() -> tuple[BaseException | Trace, float, int]:
        actor = RolloutActor.create(capacity=2)
        actor.runs.collect_wait, actor.runs.answer_timeout = 0.2, 1.0
        try:
            spec = RolloutSpec(tasks(1)[0], FreezesOnce(str(tmp_path)), ScriptedModel(default="4"))
            running = asyncio.ensure_future(actor.run(spec))
            marker = tmp_path / "task-0"
            await until(marker.exists, 30, "the rollout to start")
            pid = int(marker.read_text())
            os.kill(pid, signal.SIGSTOP)
            frozen = time.monotonic()
            # Detected in ~1.3 s on a quiet machine; Ray's kill of a stopped process takes
            # longer when the cores are busy (over 30 s seen): the bound here is a hang guard.
            async with asyncio.timeout(120):
                (outcome,) = await asyncio.gather(running, return_exceptions=True)
            return outcome, time.monotonic() - frozen, pid
        finally:
            await actor.aclose(grace=1.0)

    outcome, detected, pid = asyncio.run(main())
    assert isinstance(outcome, RayActorError), outcome
    wait_exit(pid, 120.0)  # a hang guard: Ray's kill of a stopped process is slow on a loaded machine
    report(
        Row(
            "rollout actor frozen, no executor",
            "SIGSTOP of a RolloutActor used alone",
            "collect unanswered (0.2 + 1s), killed: run() raised RayActorError",
            detected,
            "(no driver: the caller's run() was waiting)",
            0,
            int(process_alive(pid)),
        )
    )


# -- 7. a raylet frozen ---------------------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("health", ["default", "strict"])
def test_a_raylet_frozen_for_30s_loses_no_rollout(health: str, tmp_path: Path) -> None:
    """A two-node ``Cluster`` of its own, in a subprocess (see ``raylet_freeze.py``): the
    session's Ray is not touched, and the raylet is resumed by pid whatever happens.

    With Ray's own health checks a node is declared dead after 5 missed checks of up to 10 s:
    a raylet frozen for 30 s is not, and the rollouts already on its node go on (a call to an
    actor does not pass through its raylet). With strict ones it is dead within a second, and
    its rollouts are retried on the head node."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, str(HERE / "raylet_freeze.py"), "4", "30", health],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("FACTS ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    facts = json.loads(lines[-1].removeprefix("FACTS "))
    rows = facts["rows"]
    keys = {(r["group_id"], r["sample_idx"]) for r in rows}
    assert facts["status"] == "completed" and len(rows) == 4 and len(keys) == 4  # all, once each
    assert all(r["ok"] for r in rows) and facts["on_b"] > 0 and facts["frozen_for"] >= 30
    assert facts["ended_frozen"]  # the run did not wait for the raylet
    retried = sum(r["attempt"] == 1 for r in rows)
    if health == "default":
        assert facts["detected"] is None and retried == 0
        outcome = f"not declared dead: its {facts['on_b']} rollouts went on, 4 ok while frozen"
    else:
        assert facts["detected"] is not None and retried == facts["on_b"]
        outcome = f"declared dead: its {facts['on_b']} rollouts retried on the head, 4 ok while frozen"
    report(
        Row(
            f"raylet frozen 30 s ({health} health check)",
            "SIGSTOP of a worker node's raylet, SIGCONT at 30 s",
            outcome,
            facts["detected"],
            facts["meanwhile"],
            4 - len(rows),
            len(facts["leftover"]),
        )
    )
