"""Every step of a rollout's teardown is bounded (issue 24 §2): a harness session close, a
harness cleanup or a runtime stop that never returns is logged and left behind, and the
rollout still returns its trace, scored (B41)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from rollout_ray import Trace, reward
from rollout_ray._core.rollout import TEARDOWN_TIMEOUT
from rollout_ray.testing import MemoryRuntime, ScriptedHarness

from conftest import EchoTask, make_rollout, run


class Scored(EchoTask):
    @reward
    def said_hello(self, trace: Trace) -> float:
        return float(trace.last_reply == "hello")


class StopNeverReturns(MemoryRuntime):
    """Its stop returns only once the test ``release``s it (so that no task is left pending)."""

    release: asyncio.Event

    async def _teardown(self) -> None:
        self.release = asyncio.Event()
        await self.release.wait()


class CleanupNeverReturns(ScriptedHarness):
    async def cleanup(self, trace: Trace, runtime: Any) -> None:
        await asyncio.Event().wait()  # cancelled by the bound


@pytest.mark.parametrize(
    ("what", "build"),
    [
        ("stopping the runtime", lambda: make_rollout(Scored({"prompt": "hi"}), runtime_factory=StopNeverReturns)),
        ("the harness's cleanup", lambda: make_rollout(Scored({"prompt": "hi"}), harness=CleanupNeverReturns())),
    ],
    ids=["runtime-stop", "harness-cleanup"],
)
def test_a_teardown_step_that_never_returns_is_left_behind(
    what: str, build: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rollout_ray")
    rollout = build()

    async def main() -> tuple[Trace, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        async with asyncio.timeout(10 * TEARDOWN_TIMEOUT):  # virtual seconds: fails fast if unbounded
            trace = await rollout.run()
        took = loop.time() - t0
        if isinstance(rollout.runtime, StopNeverReturns):  # the stop went on in the background
            rollout.runtime.release.set()
            await rollout.runtime.stop()
        return trace, took

    trace, took = run(main())
    assert (trace.ok, trace.is_completed, trace.reward) == (True, True, 1.0)
    assert took == TEARDOWN_TIMEOUT
    assert [r.getMessage() for r in caplog.records] == [
        f"rollout {trace.id}: {what} did not finish within {TEARDOWN_TIMEOUT:g}s; left behind"
    ]
