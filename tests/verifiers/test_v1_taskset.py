"""verifiers v1 tasksets run unchanged (issue 31 §1, first slice: single-turn QA).

The differential check: our Driver runs the v1 taskset against the simulated model (with
wrong answers, so rewards differ task by task); then upstream's own ``Task.score`` scores the
same conversations on upstream's own ``Trace``; rewards (score and weight) and metrics must be
equal, task by task. What is not mapped yet is refused before anything runs, in one line.
"""

from __future__ import annotations

import asyncio
import pathlib
import subprocess
import sys
from typing import Any

import msgspec
import pytest
from pydantic import TypeAdapter
from verifiers.v1 import trace as upstream_trace
from verifiers.v1 import types as upstream_types
from verifiers.v1.configs.agent import AgentConfig
from verifiers.v1.graph import MessageNode as UpstreamNode

from rollout_ray import (
    ChatHarness,
    EvalConfig,
    OpenAIModel,
    RolloutLimits,
    SimulatedModelConfig,
    SimulatedModelServer,
    Trace,
    verifiers_tasks,
)
from rollout_ray._cli import main as cli
from rollout_ray._driver.driver import Driver
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._record.arrow import table_to_traces
from rollout_ray._verifiers import v1_taskset

EXAMPLE = str(pathlib.Path(__file__).parents[2] / "examples" / "verifiers_env.py")
REFUSED = str(pathlib.Path(__file__).parent / "v1_refused.py")
STOPS = str(pathlib.Path(__file__).parent / "v1_stops.py")
_MESSAGE = TypeAdapter(upstream_types.Message)


def _upstream_trace_of(ours: Trace, data: Any) -> Any:
    """Our trace's conversation and calls as upstream's own ``Trace``."""
    nodes = [
        UpstreamNode(
            parent=n.parent, sampled=n.sampled, message=_MESSAGE.validate_python(msgspec.to_builtins(n.message))
        )
        for n in ours.nodes
    ]
    calls = [
        upstream_trace.ModelCall(node=c.node, usage=upstream_types.Usage(**msgspec.to_builtins(c.usage)))
        for c in ours.calls
        if c.usage is not None
    ]
    return upstream_trace.Trace(
        task=upstream_trace.TraceTask(type="T", data=data),
        nodes=nodes,
        calls=calls,
        agent=upstream_trace.AgentInfo(config=AgentConfig()),
    )


def _executor(kind: str, request: pytest.FixtureRequest) -> Any:
    if kind == "local":
        return LocalExecutor(runtime="local")
    request.getfixturevalue("ray_cluster")
    from rollout_ray._ray.ray_executor import RayExecutor

    return RayExecutor(actors=1, runtime="local")  # the example is a .py file: its module travels by value


@pytest.mark.parametrize("kind", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_a_v1_qa_taskset_scores_task_by_task_as_upstreams_own_scoring(
    kind: str, request: pytest.FixtureRequest
) -> None:
    module = v1_taskset(EXAMPLE)
    tasks = module.tasks()

    async def main() -> Any:
        simulated = SimulatedModelConfig(ttft=0, error_rate=0.5, seed=3)
        async with (
            SimulatedModelServer(simulated) as server,
            OpenAIModel(server.base_url, name="simulated") as model,
            _executor(kind, request) as executor,
        ):
            config = EvalConfig(sampling={"temperature": 0}, limits=RolloutLimits(max_turns=4))
            return await Driver(tasks, ChatHarness(), model, executor=executor, config=config).arun()

    traces = {t.task.idx: t for t in table_to_traces(asyncio.run(main()).samples)}
    assert sorted(traces) == list(range(8))
    rewards = set()
    for task in tasks:
        ours = traces[task.data.idx]
        assert ours.ok and ours.stop_condition == "agent_completed" and ours.num_turns == 1, ours.errors
        assert ours.task.type == type(task.upstream).__name__  # upstream's TraceTask.type
        upstream = _upstream_trace_of(ours, task.upstream.data)
        asyncio.run(task.upstream.score(upstream))
        assert {k: (r.score, r.weight) for k, r in ours.rewards.items()} == {
            k: (r.score, r.weight) for k, r in upstream.rewards.items()
        }, task.data.idx
        assert ours.metrics == upstream.metrics, task.data.idx
        assert ours.task.key == task.upstream.key
        rewards.add(ours.reward)
    assert rewards == {0.0, 1.0}  # wrong answers and right ones: the comparison could fail


@pytest.mark.parametrize("kind", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_v1_trace_stops_run_before_every_turn_in_upstreams_order(kind: str, request: pytest.FixtureRequest) -> None:
    """Both stops fire before the first turn: ``out_of_budget`` (priority 1) names the stop
    though ``always`` sorts first by name; the rollout is ok, with no turn, and scored. On
    Ray the stops run in a worker that has the taskset's module by value (its annotations
    unresolvable there: they were a NameError)."""
    tasks = v1_taskset(STOPS).tasks()
    assert [h.name for h in tasks[0].hooks("stop")] == ["out_of_budget", "always"]

    async def main() -> Any:
        async with (
            SimulatedModelServer(SimulatedModelConfig(ttft=0)) as server,
            OpenAIModel(server.base_url, name="simulated") as model,
            _executor(kind, request) as executor,
        ):
            config = EvalConfig(limits=RolloutLimits(max_turns=4))
            return await Driver(tasks, ChatHarness(), model, executor=executor, config=config).arun()

    traces = table_to_traces(asyncio.run(main()).samples)
    assert [(t.ok, t.stop_condition, t.num_turns, t.reward) for t in traces] == [(True, "out_of_budget", 0, 0.0)] * 2, [
        t.errors for t in traces
    ]


def _run_in_process(taskset_name: str) -> list[Trace]:
    from verifiers.v1.configs.taskset import TasksetConfig

    v1_taskset(STOPS)  # imports the file as users' tasksets are imported
    tasks = verifiers_tasks(getattr(sys.modules["verifiers_taskset_v1_stops"], taskset_name)(TasksetConfig()))

    async def main() -> Any:
        async with (
            SimulatedModelServer(SimulatedModelConfig(ttft=0)) as server,
            OpenAIModel(server.base_url, name="simulated") as model,
            LocalExecutor(runtime="local") as executor,
        ):
            config = EvalConfig(limits=RolloutLimits(max_turns=4), sampling={"temperature": 0})
            return await Driver(tasks, ChatHarness(), model, executor=executor, config=config).arun()

    return sorted(table_to_traces(asyncio.run(main()).samples), key=lambda t: t.task.idx or 0)


def test_v1_request_and_response_stops_see_upstreams_types_at_our_boundary() -> None:
    """A request stop fires before the model is asked (no turn); a response stop after the
    turn it judged (committed: one turn); a task neither fires on completes."""
    traces = _run_in_process("WatchTaskset")
    assert [(t.ok, t.stop_condition, t.num_turns) for t in traces] == [
        (True, "said_four", 1),
        (True, "asked_secret", 0),
        (True, "agent_completed", 1),
    ], [t.errors for t in traces]


def test_v1_interceptors_rewrite_the_request_and_the_response_in_upstreams_types() -> None:
    """The request interceptor asks 5 + 5 instead (the model answers 10); the response one
    says it in words; both are recorded, and the reward reads the rewritten reply."""
    (trace,) = _run_in_process("RewriteTaskset")
    assert (trace.ok, trace.last_reply, trace.reward) == (True, "ten", 1.0), trace.errors
    assert [r.handler for r in trace.request_rewrites] == ["harder"]
    assert [r.handler for r in trace.response_rewrites] == ["in_words"]
    assert trace.messages[-2].content == "What is 5 + 5?"


def test_a_taskset_object_and_its_views_give_their_tasks_in_upstreams_order() -> None:
    """``verifiers_tasks`` takes what v1 users hold (a ``Taskset``, a view of it) for ``Driver``."""
    from verifiers.v1.configs.taskset import TasksetConfig

    v1_taskset(EXAMPLE)  # imports the example's file as users' tasksets are imported
    taskset_cls = sys.modules["verifiers_taskset_verifiers_env"].ArithTaskset
    view = taskset_cls(TasksetConfig()).shuffle(seed=1).take(3)
    ours = verifiers_tasks(view)
    assert [t.data.model_dump(include={"idx", "prompt", "answer"}) for t in ours] == [
        {"idx": t.data.idx, "prompt": t.data.prompt, "answer": t.data.answer} for t in view
    ]
    assert len({t.data.idx for t in ours}) == 3 and [t.upstream.key for t in ours] == [t.key for t in view]
    with pytest.raises(
        ValueError,
        match=r"^verifiers taskset Endless is infinite: give a limit \(--limit N\), "
        r"or take\(n\) of it$",
    ):
        verifiers_tasks(type("Endless", (taskset_cls,), {"INFINITE": True})(TasksetConfig()))
    assert len(verifiers_tasks(type("Endless", (taskset_cls,), {"INFINITE": True})(TasksetConfig()), 2)) == 2


def test_what_is_not_mapped_is_refused_before_anything_runs_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["eval", "--verifiers", REFUSED, "--executor", "local", "--out", str(out)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "rollout-ray eval: error: verifiers task SetupTask: not mapped onto rollout_ray yet: it overrides "
        "stage_verifier() (no artifacts are restored here)"
    ]
    assert not out.exists()


def test_rollout_ray_eval_runs_the_example_v1_environment(tmp_path: pathlib.Path) -> None:
    """``rollout-ray eval --verifiers examples/verifiers_env.py``, in its own process."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollout_ray",
            "eval",
            "--verifiers",
            EXAMPLE,
            "--samples",
            "2",
            "--executor",
            "local",
            "--runtime",
            "local",
            "--temperature",
            "0",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "mean reward 1.0000" in done.stdout and "stop conditions  agent_completed=16" in done.stdout, done.stdout
