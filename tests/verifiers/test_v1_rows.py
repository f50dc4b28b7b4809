"""A v1 row as ours: the fields we share mapped, the row's own kept, and a row asking for what
is not mapped yet refused in one line (issue 31 §1)."""

from __future__ import annotations

import asyncio
import pathlib

import pytest
import verifiers.v1 as vf

from rollout_ray import RolloutTimeouts, TaskResources, ToolCall, Trace
from rollout_ray._core.tools import LocalTools
from rollout_ray._runtimes.local import LocalRuntime
from rollout_ray._verifiers.v1_runtime import V1Runtime
from rollout_ray._verifiers.v1_task import V1Task, adapter_class


class QA(vf.TaskData):
    answer: str


class QATask(vf.Task[QA]):
    @vf.reward(weight=2.0, priority=1)
    async def exact(self, task: QA, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)


def test_the_shared_fields_are_mapped_and_the_rows_own_are_kept() -> None:
    data = QA(
        idx=4,
        id="q-4",
        name="four",
        prompt=[vf.UserMessage(content="2+2?")],
        system_prompt="Be brief.",
        timeout=vf.TaskTimeout(agent=30),
        network_allow=["pypi.org"],
        answer="4",
    )
    task = adapter_class(QATask)(QATask(data))
    assert isinstance(task, V1Task) and type(task).__name__ == "QATask"
    assert task.data.model_dump(exclude={"network_block", "image"}) == {
        "idx": 4,
        "name": "four",
        "prompt": [{"role": "user", "content": "2+2?"}],
        "system_prompt": "Be brief.",
        "timeout": {"setup": None, "agent": 30.0, "finalize": None, "scoring": None},
        "network_allow": ["pypi.org"],
        "runtime": None,
        "resources": None,
        "id": "q-4",
        "description": None,
        "answer": "4",
    }
    assert task.data.timeout == RolloutTimeouts(agent=30)
    assert task.key == QATask(data).key
    (hook,) = task.hooks("reward")
    assert (hook.name, hook.weight, hook.priority) == ("exact", 2.0, 1)


def test_a_rows_cores_and_memory_are_its_runtimes_resources() -> None:
    """Issue 32: upstream's ``TaskResources(cpu, memory)`` was refused; now it is the task's
    ``TaskData.resources`` (what podman and the sandbox hold its runtime to)."""
    task = V1Task(QATask(QA(prompt="2+2?", answer="4", resources=vf.TaskResources(cpu=2, memory=0.5))))
    assert task.data.resources == TaskResources(cpu=2, memory=0.5)
    assert task.data.resources.memory_bytes == 500_000_000
    assert V1Task(QATask(QA(prompt="2+2?", answer="4"))).data.resources is None


def test_upstream_defaults_mean_no_policy_and_no_timeout() -> None:
    task = V1Task(QATask(QA(prompt="2+2?", answer="4")))
    assert (task.data.network_allow, task.data.network_block, task.data.timeout) == (None, None, None)
    assert not task.data.network_policy


@pytest.mark.parametrize(
    ("update", "reason"),
    [
        ({"workdir": "/app"}, "its row sets workdir"),
        ({"agent_user": "agent"}, "its row sets agent_user"),
        (
            {"resources": vf.TaskResources(cpu=2, gpu="A100")},
            r"its row asks for gpu \(cpu=2\.0 memory=None gpu='A100' disk=None\)",
        ),
    ],
)
def test_a_row_asking_for_what_is_not_mapped_is_refused_in_one_line(update: dict[str, object], reason: str) -> None:
    upstream = QATask(QA(prompt="2+2?", answer="4").model_copy(update=update))
    with pytest.raises(ValueError, match=rf"^verifiers task QATask: not mapped onto rollout_ray yet: {reason}$"):
        V1Task(upstream)


def test_upstream_runtime_calls_we_do_not_map_fail_naming_the_member(tmp_path: pathlib.Path) -> None:
    """A v1 task's runtime here has upstream's run / read / write / alive; any other member
    is an AttributeError that names it and says what there is."""
    runtime = V1Runtime(LocalRuntime(root=str(tmp_path)))
    with pytest.raises(
        AttributeError,
        match=r"^upstream Runtime.prepare_uv_script is not mapped onto rollout_ray's "
        r"runtime; a v1 task here may call run, run_program, read, write and alive$",
    ):
        runtime.prepare_uv_script("print(1)")


class _Counter(vf.State):
    calls: int = 0


class _CalcConfig(vf.ToolsetConfig):
    pass


class _Stateful(vf.Toolset[_CalcConfig, _Counter]):
    @vf.tool
    async def add(self, a: int, b: int) -> int:
        self.state.calls += 1
        return a + b


class _PerTask(vf.Toolset[_CalcConfig]):
    async def setup_task(self, task: object) -> None:
        pass


class _Remote(vf.Toolset[_CalcConfig]):
    pass


def test_a_toolset_keeping_state_is_mapped_its_state_read_and_written_on_each_callers_trace() -> None:
    """As upstream's server pulls the state before a ``@vf.tool`` call and pushes it after:
    each call sees its own rollout's ``trace.state`` (two rollouts, one toolset class)."""

    class Tooled(vf.Task[QA, _Counter]):
        @classmethod
        def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
            return [_Stateful(_CalcConfig())]

    task = adapter_class(Tooled)(Tooled(QA(prompt="2+2?", answer="4")))
    assert type(task).state_type is _Counter

    async def calls() -> list[Trace]:
        traces = [Trace(task=task.trace_task(), state={"calls": n, "artifacts": {}}) for n in (0, 10)]
        for trace in (*traces, traces[0]):
            tools = LocalTools(task.toolsets(task.config), None, caller=trace.id, trace=trace)
            (spec,) = tools.specs()
            outcome = await tools.call(ToolCall("c1", spec.name, '{"a": 2, "b": 2}'))
            assert (outcome.content, outcome.error) == ("4", None)
        return traces

    first, second = asyncio.run(calls())
    assert (first.state["calls"], second.state["calls"]) == (2, 11)


@pytest.mark.parametrize(
    ("toolset", "reason"),
    [
        (lambda: _PerTask(_CalcConfig()), r"its toolset _PerTask overrides setup_task\(\)"),
        (lambda: _Remote(_CalcConfig(url="http://127.0.0.1:9/mcp")), "its toolset _Remote is a server at a url$"),
    ],
)
def test_a_toolset_we_cannot_serve_as_upstream_does_is_refused_in_one_line(toolset: object, reason: str) -> None:
    class Tooled(vf.Task[QA]):
        @classmethod
        def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
            return [toolset()]  # type: ignore[operator]

    with pytest.raises(ValueError, match=rf"^verifiers task Tooled: not mapped onto rollout_ray yet: {reason}"):
        V1Task(Tooled(QA(prompt="2+2?", answer="4")))


def test_a_program_harness_with_task_toolsets_is_refused_in_one_line(tmp_path: pathlib.Path) -> None:
    """Our proxy hands a v1 program harness no MCP servers: a taskset pairing one with tasks
    that have toolsets would run without its tools, so it is refused before anything runs."""
    from rollout_ray._verifiers import v1_taskset

    source = tmp_path / "paired.py"
    source.write_text("""
import verifiers.v1 as vf


class CalcConfig(vf.ToolsetConfig):
    pass


class Calc(vf.Toolset[CalcConfig]):
    @vf.tool
    async def add(self, a: int, b: int) -> int:
        return a + b


class ToolTask(vf.Task):
    @classmethod
    def toolsets(cls, config):
        return [Calc(CalcConfig())]


class Tools(vf.Taskset[ToolTask]):
    def load(self):
        yield ToolTask(vf.TaskData(prompt="What is 1 + 1?"), self.config.task)


class Program(vf.Harness[vf.HarnessConfig]):
    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data):
        return vf.ProgramResult(0, "", "")


__all__ = ["Tools", "Program"]
""")
    with pytest.raises(
        ValueError,
        match=r"^verifiers taskset .*paired\.py: not mapped onto rollout_ray yet: its tasks "
        r"have toolsets and it pairs its own harness \(Program\), which would get no "
        r"tools here$",
    ):
        v1_taskset(str(source))
