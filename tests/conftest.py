"""Shared builders for lifecycle tests (no Ray here; the Ray fixture arrives with the actors)."""

from __future__ import annotations

import logging
import os
import select
import sys
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from rollout_ray import Rollout, Task, Trace, reward
from rollout_ray.testing import MemoryRuntime, ScriptedHarness, ScriptedModel, VirtualTimeLoop

T = TypeVar("T")


class EchoTask(Task):
    """A task with no hooks; scored by nothing."""


class Echo(Task):
    """Rewarded when the last reply is "4"."""

    @reward
    def said_four(self, trace: Trace) -> float:
        return float(trace.last_reply == "4")


def tasks(n: int) -> list[Echo]:
    return [Echo({"idx": i, "prompt": f"question {i}"}) for i in range(n)]


SLEEPER = ["sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 & echo $!"]
"""Starts a background process that escapes its session, and prints its pid."""


def make_rollout(
    task: Task | None = None,
    *,
    model: ScriptedModel | None = None,
    harness: Any = None,
    runtime: Any = None,
    **kwargs: Any,
) -> Rollout:
    """A rollout on fakes: prompt "hi", a model answering "hello", an owned MemoryRuntime."""
    kwargs.setdefault("runtime_factory", MemoryRuntime)
    if harness is None:
        # Given services are what a test looks at: the harness must be served by them.
        harness = ScriptedHarness(in_process="interception" not in kwargs and "tool_server" not in kwargs)
    return Rollout(
        task or EchoTask({"prompt": "hi"}),
        harness,
        model=model or ScriptedModel(default="hello"),
        runtime=runtime,
        **kwargs,
    )


@pytest.fixture
def caplog_info(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="rollout_ray")
    return caplog


_loops: list[VirtualTimeLoop] = []


@pytest.fixture(autouse=True)
def _virtual_loop() -> Iterator[None]:
    """One virtual-clock loop per test, so open / step / close share their loop."""
    loop = VirtualTimeLoop()
    _loops.append(loop)
    try:
        yield
    finally:
        _loops.remove(loop)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on this test's virtual-clock loop."""
    return _loops[-1].run_until_complete(coro)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """The one local Ray instance of the test session (2 CPUs, no dashboard)."""
    ray = pytest.importorskip("ray")
    from rollout_ray._ray.head import lean_head

    # address="local": a Ray cluster someone else runs on this machine (its /tmp/ray file) is not joined
    with lean_head():  # as init_ray starts a private Ray: the suite runs on what users get
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import it
    try:
        yield ray
    finally:
        ray.shutdown()


def process_alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (dead, waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat_line = f.read()
    except FileNotFoundError:
        return False
    return stat_line.rsplit(")", 1)[1].split()[0] != "Z"


def wait_exit(pid: int, timeout: float) -> None:
    """Block until ``pid`` (not necessarily our child) exits: a pidfd event, not a poll."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"process {pid} still running after {timeout}s"
    finally:
        os.close(fd)


SUITE_ROWS: list[tuple[str, str, str, str, float]] = []
"""Rows of the end-of-session table of the fault and security suites:
(scenario, injected, recovered, lost or left over, seconds to detect or recover)."""


@pytest.fixture
def report() -> Callable[[str, str, str, str, float], None]:
    """``report(scenario, injected, recovered, lost, seconds)``: a row of the suites' table."""

    def add(scenario: str, injected: str, recovered: str, lost: str, seconds: float) -> None:
        SUITE_ROWS.append((scenario, injected, recovered, lost, seconds))

    return add


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    """Keep each phase's report on the test item (``item.rep_call``: did the test pass?)."""
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The fault and security suites' table (``-m "faults or security"``), when they ran."""
    if not SUITE_ROWS:
        return
    header = ("scenario", "injected", "recovered", "lost / left over", "time")
    cells = [header, *[(s, i, r, lo, f"{t:.2f}s") for s, i, r, lo, t in SUITE_ROWS]]
    widths = [max(len(row[k]) for row in cells) for k in range(len(header))]
    terminalreporter.section("fault injection and security")
    for n, row in enumerate(cells):
        terminalreporter.write_line("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if n == 0:
            terminalreporter.write_line("  ".join("-" * w for w in widths))
