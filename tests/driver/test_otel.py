"""OpenTelemetry spans per rollout and phase (issue 24 §4), read back through the SDK's
in-memory exporter; and nothing at all when OpenTelemetry is not configured or not installed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest

from rollout_ray import ChatHarness, Toolset, tool
from rollout_ray._driver.driver import Driver, EvalConfig, RunResult
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray.testing import Reply, ScriptedModel

from conftest import Echo

otel_trace = pytest.importorskip("opentelemetry.trace", reason="the [otel] extra is not installed")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace", reason="the [otel] extra is not installed")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402 - after the skip
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402


@pytest.fixture(scope="module")
def spans() -> Any:
    """An exporter on the process's tracer provider, as a user would configure it."""
    provider = otel_trace.get_tracer_provider()
    if not isinstance(provider, sdk_trace.TracerProvider):  # the global one can be set only once
        provider = sdk_trace.TracerProvider()
        otel_trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


class Notes(Toolset):
    name = "notes"

    @tool
    async def read(self, key: str) -> str:
        """The note under ``key``."""
        return f"note {key}"


class WithNotes(Echo):
    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [Notes()]


def run_two() -> RunResult:
    model = ScriptedModel([Reply(tool_calls=[("read", {"key": "a"})])], default="4")

    async def main() -> RunResult:
        async with LocalExecutor() as executor:
            driver = Driver(
                [WithNotes({"idx": 0, "prompt": "read a"}), Echo({"idx": 1, "prompt": "say 4"})],
                ChatHarness(retries=0),
                model,
                executor=executor,
                config=EvalConfig(samples_per_task=1),
            )
            return await driver.arun()

    return asyncio.run(main())


def test_each_rollout_is_a_span_with_its_phases_and_calls_as_children(spans: Any) -> None:
    spans.clear()
    result = run_two()
    finished = spans.get_finished_spans()
    roots = {s.attributes["rollout.id"]: s for s in finished if s.name == "rollout"}
    assert sorted(roots) == sorted(result.samples["rollout_id"].to_pylist())
    for row in result.samples.to_pylist():
        root = roots[row["rollout_id"]]
        assert root.parent is None
        assert root.attributes["rollout.task"] == ("WithNotes" if row["task_idx"] == 0 else "Echo")
        assert (root.attributes["rollout.task_idx"], root.attributes["rollout.ok"]) == (row["task_idx"], True)
        assert (root.attributes["rollout.reward"], root.attributes["rollout.attempt"]) == (1.0, 0)
        assert root.attributes["rollout.run_id"] == row["run_id"]
        children = [s for s in finished if s.parent is not None and s.parent.span_id == root.context.span_id]
        phases = ["rollout.boot", "rollout.setup", "rollout.agent", "rollout.finalize", "rollout.scoring"]
        assert [s.name for s in children] == phases
        for child in children:
            assert child.attributes["rollout.id"] == row["rollout_id"]
            assert root.start_time <= child.start_time <= child.end_time <= root.end_time
        (agent,) = [s for s in children if s.name == "rollout.agent"]
        inside = [s for s in finished if s.parent is not None and s.parent.span_id == agent.context.span_id]
        assert [s.name for s in inside] == ["rollout.model_call"] * (2 if row["task_idx"] == 0 else 1)
        for step in inside:
            assert agent.start_time <= step.start_time <= step.end_time <= agent.end_time


def test_a_failed_rollout_span_carries_its_error(spans: Any) -> None:
    spans.clear()

    async def main() -> RunResult:
        async with LocalExecutor() as executor:
            model = ScriptedModel(default=RuntimeError("upstream gone"))
            driver = Driver(
                [Echo({"idx": 0, "prompt": "q"})],
                ChatHarness(retries=0),
                model,
                executor=executor,
                config=EvalConfig(samples_per_task=1, breaker=100),
            )
            return await driver.arun()

    result = asyncio.run(main())
    (row,) = result.samples.to_pylist()
    (root,) = [s for s in spans.get_finished_spans() if s.name == "rollout"]
    assert not row["ok"] and root.attributes["rollout.ok"] is False
    assert root.status.status_code == otel_trace.StatusCode.ERROR
    assert root.attributes["rollout.error_type"] == row["error_type"]
    assert root.status.description.startswith(row["error_type"] + ": ")


NO_OTEL = """
import asyncio, sys
sys.modules["opentelemetry"] = None  # as if the [otel] extra were not installed
sys.path.insert(0, sys.argv[1])
from conftest import Echo
from rollout_ray import ChatHarness
from rollout_ray._driver import otel
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray.testing import ScriptedModel

async def main():
    async with LocalExecutor() as executor:
        driver = Driver([Echo({"idx": 0, "prompt": "q"})], ChatHarness(retries=0), ScriptedModel(default="4"),
                        executor=executor, config=EvalConfig(samples_per_task=1))
        return await driver.arun()

result = asyncio.run(main())
print(otel.otel, result.status, result.samples["reward"].to_pylist())
"""


def test_without_the_extra_a_run_makes_no_spans_and_runs_as_before() -> None:
    tests = str(__import__("pathlib").Path(__file__).parents[1])
    done = subprocess.run([sys.executable, "-c", NO_OTEL, tests], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "None completed [1.0]\n"
