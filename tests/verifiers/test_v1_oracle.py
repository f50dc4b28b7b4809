"""Differential check against verifiers' own eval runner (issue 31 §1).

The same v1 tasksets (``envs/``, written as users write them) run through upstream's
``run_eval`` (its ``Env``, ``Rollout``, interception server, ``null`` harness and chat
program: ``upstream_runner.py``) and through our ``Driver``, each against its own simulated
model of one config at temperature 0; task by task they give the same rewards (score and
weight), metrics, stop conditions, turn counts, ok and error types.
"""

from __future__ import annotations

import asyncio
import gc
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
from upstream_runner import offline_chat_program, run_upstream_eval
from verifiers.v1 import trace as upstream_trace

from rollout_ray import EvalConfig, OpenAIModel, RolloutLimits, SimulatedModelConfig, SimulatedModelServer
from rollout_ray._driver.driver import Driver
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._record.arrow import table_to_traces
from rollout_ray._verifiers import v1_taskset

ENVS = pathlib.Path(__file__).parent / "envs"


def stop_condition_of(error_type: str) -> str:
    """verifiers 0.4.0's stop for a typed rollout error (``errors.stop_condition``)."""
    return f"{error_type.removesuffix('Error').lower()}_error"


MODEL = SimulatedModelConfig(ttft=0)


# Upstream's SubprocessRuntime SIGKILLs the programs it stops (a toolset's server at teardown,
# a program past its deadline) but never waits for them: asyncio warns of their transports
# when they are collected. Each test here collects them itself (``envs_importable``), under
# this filter, so the warning cannot land in whichever test runs next.
pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture
def envs_importable(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """The test tasksets importable by their loader ids (``v1-qa`` is the module ``v1_qa``),
    as an installed environment is; upstream's runner offline."""
    monkeypatch.syspath_prepend(str(ENVS))
    monkeypatch.setenv("PYTHONPATH", str(ENVS))  # upstream serves a toolset as `python -m <its module>`
    monkeypatch.setenv("SIMULATED_API_KEY", "unused")  # the client's key variable must be set
    monkeypatch.setenv("SUM_JUDGE_URL", "")  # restored after the test; each side sets its own
    offline_chat_program(monkeypatch, tmp_path / "verifiers-cache")
    yield tmp_path
    gc.collect()


def _executor(kind: str, request: pytest.FixtureRequest) -> Any:
    if kind == "local":
        return LocalExecutor(runtime="local")
    ray = request.getfixturevalue("ray_cluster")
    from rollout_ray._ray.ray_executor import RayExecutor

    for name in ("v1_qa", "v1_hooks", "v1_tools", "v1_ledger"):  # the workers do not have envs/ on their path
        module = __import__(name)
        ray.cloudpickle.register_pickle_by_value(module)
    return RayExecutor(actors=1, runtime="local")


def _outcome(trace: Any) -> dict[str, Any]:
    """What must agree, of either side's trace (upstream's and ours read alike)."""
    stop = trace.stop_condition
    if isinstance(trace, upstream_trace.Trace) and trace.errors and stop == stop_condition_of(trace.errors[-1].type):
        # Where we differ on purpose (docs/verifiers.md, "Where we differ from upstream"; spec §3,
        # record_error): a recorded failure stops the trace with `error`, as at the upstream
        # commit our rules follow; verifiers 0.4.0 names it `<boundary>_error`.
        stop = "error"
    return {
        "ok": trace.ok,
        "stop": stop,
        "turns": trace.num_turns,
        "rewards": {k: (r.score, r.weight) for k, r in trace.rewards.items()},
        "metrics": dict(trace.metrics),
        "errors": [e.type for e in trace.errors],
    }


def _both(
    taskset_id: str, out: pathlib.Path, kind: str, request: pytest.FixtureRequest, harness: str = "null"
) -> tuple[list[Any], list[Any]]:
    """Our traces and upstream's, by row. Each side has its own simulated model, and its own
    for a judge plugin to ask (``SUM_JUDGE_URL``, read when the taskset is made)."""

    async def ours() -> list[Any]:
        async with (
            SimulatedModelServer(MODEL) as server,
            SimulatedModelServer(MODEL) as judge,
            OpenAIModel(server.base_url, name="simulated") as model,
            _executor(kind, request) as executor,
        ):
            os.environ["SUM_JUDGE_URL"] = judge.base_url
            module = v1_taskset(taskset_id)
            config = EvalConfig(sampling={"temperature": 0}, limits=RolloutLimits(max_turns=8))
            result = await Driver(module.tasks(), module.harness(), model, executor=executor, config=config).arun()
        return sorted(table_to_traces(result.samples), key=lambda t: t.task.idx or 0)

    async def theirs() -> list[Any]:
        async with SimulatedModelServer(MODEL) as server, SimulatedModelServer(MODEL) as judge:
            os.environ["SUM_JUDGE_URL"] = judge.base_url
            return await run_upstream_eval(taskset_id, server.base_url, out, harness)

    return asyncio.run(ours()), asyncio.run(theirs())


@pytest.mark.parametrize("kind", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_a_qa_taskset_gives_what_verifiers_own_runner_gives_task_by_task(
    envs_importable: pathlib.Path, kind: str, request: pytest.FixtureRequest
) -> None:
    ours, theirs = _both("v1-qa", envs_importable / "out", kind, request)
    assert [t.task.idx for t in ours] == [t.task.data.idx for t in theirs] == list(range(6))
    for mine, upstream in zip(ours, theirs):
        assert _outcome(mine) == _outcome(upstream), mine.task.idx
        assert mine.last_reply == upstream.last_reply and mine.task.key == upstream.task.key
    assert {t.reward for t in ours} == {0.0, 2.0}  # right and wrong answers: the comparison could fail


def test_stops_and_interceptors_give_what_verifiers_own_runner_gives_task_by_task(
    envs_importable: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    """Each row meets another hook: a request rewritten and its response rewritten; a
    request stop (no turn); a response stop (its turn kept); none."""
    ours, theirs = _both("v1-hooks", envs_importable / "out", "local", request)
    assert [_outcome(t)["stop"] for t in theirs] == ["agent_completed", "asked_secret", "said_four", "agent_completed"]
    for mine, upstream in zip(ours, theirs, strict=True):
        assert _outcome(mine) == _outcome(upstream), mine.task.idx
        assert mine.last_reply == upstream.last_reply


@pytest.mark.parametrize("kind", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_a_multi_turn_tool_taskset_gives_what_verifiers_own_runner_gives_task_by_task(
    envs_importable: pathlib.Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """Upstream serves the task's ``vf.Toolset`` over MCP in a process per rollout; ours
    calls its ``@vf.tool`` methods in our tool server, offered under upstream's names
    (``calc_add``): the model calls it, reports its result (wrong over 100), two turns."""
    ours, theirs = _both("v1-tools", envs_importable / "out", kind, request)
    assert [(t.num_turns, t.reward) for t in theirs] == [(2, 1.0), (2, 0.0), (2, 1.0), (2, 1.0)]
    for mine, upstream in zip(ours, theirs, strict=True):
        assert _outcome(mine) == _outcome(upstream), mine.task.idx
        assert [c.name for c in mine.tool_calls] == ["calc_add"]
        assert mine.last_reply == upstream.last_reply


@pytest.mark.parametrize("kind", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_a_taskset_keeping_state_with_a_stateful_toolset_gives_what_verifiers_own_runner_gives(
    envs_importable: pathlib.Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """The task's ``setup`` writes ``trace.state``; its toolset keeps the same ``State``
    (upstream's server pulls and pushes it over ``/state``; ours reads and writes the
    rollout's trace around each call); a ``@stop`` reads what the tool wrote before the next
    model call; a reward and a metric read it after. Task by task: right, wrong by the
    offset setup wrote, stopped by the state."""
    ours, theirs = _both("v1-ledger", envs_importable / "out", kind, request)
    assert [(t.stop_condition, t.num_turns, t.reward) for t in theirs] == [
        ("agent_completed", 2, 1.5),
        ("agent_completed", 2, 0.5),
        ("over_budget", 1, 0.5),
    ]
    for mine, upstream in zip(ours, theirs, strict=True):
        assert _outcome(mine) == _outcome(upstream), mine.task.idx
        assert mine.state == upstream.state.model_dump(mode="json"), mine.task.idx
        assert [c.name for c in mine.tool_calls] == ["calc_add"]


def test_setup_finalize_and_runtime_scorers_give_what_verifiers_own_runner_gives_task_by_task(
    envs_importable: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    """The task's ``setup`` writes into the box, ``finalize`` runs a program there, a reward
    and a metric read them back: upstream's subprocess runtime and our local one alike."""
    ours, theirs = _both("v1-box", envs_importable / "out", "local", request)
    assert [t.reward for t in theirs] == [1.0, 0.0, 1.0]
    for mine, upstream in zip(ours, theirs, strict=True):
        assert _outcome(mine) == _outcome(upstream), mine.task.idx


def test_a_plugged_judge_with_stops_and_interceptors_gives_what_verifiers_own_runner_gives(
    envs_importable: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    """A judge plugin on the task's config (weight 0.5) asks its own model; an interceptor
    makes one reply disagree with it; a response stop ends another rollout. Rewards (the
    judge's under its plugin id), stops and the judge's usage match upstream's task by task."""
    ours, theirs = _both("v1-judged", envs_importable / "out", "local", request)
    assert [(t.stop_condition, t.rewards["v1-sum-judge"].score) for t in theirs] == [
        ("agent_completed", 1.0),
        ("agent_completed", 0.0),
        ("said_ten", 1.0),
    ]
    for mine, upstream in zip(ours, theirs, strict=True):
        assert _outcome(mine) == _outcome(upstream), mine.task.idx
        assert [(u.prompt_tokens, u.completion_tokens) for u in mine.extra_usage] == [
            (u.prompt_tokens, u.completion_tokens) for u in upstream.extra_usage
        ]


def test_a_program_harness_taskset_gives_what_verifiers_own_runner_gives_task_by_task(
    envs_importable: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    """The taskset's own ``vf.Harness`` launches its program in the runtime, which talks to
    the model at the endpoint it is handed (upstream's interception, our proxy): two turns,
    one reward wrong; a program that exits 3 is a HarnessError on both sides."""
    ours, theirs = _both("v1-program", envs_importable / "out", "local", request, harness="v1-program")
    assert [(t.num_turns, t.reward, [e.type for e in t.errors]) for t in theirs] == [
        (2, 1.0, []),
        (2, 0.0, []),
        (1, 0.0, ["HarnessError"]),
    ]
    for mine, upstream in zip(ours, theirs, strict=True):
        assert _outcome(mine) == _outcome(upstream), mine.task.idx


def test_a_per_task_timeout_gives_what_verifiers_own_runner_gives_but_where_b27_differs(
    envs_importable: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    """A row's ``TaskTimeout(agent=1)`` bounds its program's segment on both sides (its
    program hangs after one turn; the row without one completes alike). Where we differ on
    purpose, B27 (docs/lifecycle.md): the expired deadline is a failure here (a typed
    error, stop ``error``, not scored: B42), where verifiers 0.4.0 stops with
    ``agent_timeout`` and scores the run."""
    ours, theirs = _both("v1-slow", envs_importable / "out", "local", request, harness="v1-slow")
    assert _outcome(ours[0]) == _outcome(theirs[0])
    assert (theirs[1].ok, theirs[1].stop_condition, theirs[1].num_turns) == (True, "agent_timeout", 1)
    assert (ours[1].ok, ours[1].stop_condition, ours[1].num_turns, ours[1].rewards) == (False, "error", 1, {})
    assert [e.type for e in ours[1].errors] == ["HarnessError"] and "1" in ours[1].errors[0].message, ours[1].errors
