"""Scoring (B47–B51): seeding, phase order, Mapping results, weights, plugged hooks, judges."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from rollout_ray import (
    HarnessError,
    Judge,
    PluggedReward,
    Reward,
    Rollout,
    Task,
    TaskConfig,
    TaskData,
    TaskError,
    Trace,
    TraceTask,
    metric,
    reward,
    stop,
)
from rollout_ray.testing import MemoryRuntime, Reply, ScriptedHarness, ScriptedModel, run_virtual


def new_trace() -> Trace:
    return Trace(task=TraceTask(type="T"))


def score(task: Task, trace: Trace, runtime: object = None) -> Trace:
    asyncio.run(task.score(trace, runtime))
    return trace


def run_rollout(task: Task, harness: ScriptedHarness, model: ScriptedModel | None = None) -> Trace:
    model = model or ScriptedModel(default="hi")
    return run_virtual(Rollout(task, harness, model=model, runtime_factory=MemoryRuntime).run())


class Phased(Task):
    """Records, into ``log``, what each phase saw of the earlier phases."""

    log: list[str]

    @metric
    def m1(self) -> float:
        self.log.append("m1")
        return 2

    @metric
    async def m2(self, trace: Trace) -> float:
        await asyncio.sleep(0)  # m1 has returned, but a phase records only once all are done
        self.log.append(f"m2 saw m1={trace.metrics['m1']}")
        return True

    @reward(weight=0.5)
    def r(self, trace: Trace) -> float:
        self.log.append(f"r saw m1={trace.metrics['m1']} j={trace.rewards['grade']}")
        return trace.metrics["m1"] / 4


class Grade(Judge):
    def __init__(self, log: list[str], **kw) -> None:
        super().__init__(**kw)
        self.log = log

    async def score(self, task: TaskData, trace: Trace) -> float:
        self.log.append(f"judge saw r={trace.rewards['r']} task={task.prompt}")
        return 1.0


def test_b47_b51_phases_run_metrics_then_rewards_then_weighted_judges():
    log: list[str] = []
    task = Phased({"prompt": "p"}, TaskConfig(judges=[Grade(log, name="grade", weight=2.0)]))
    task.log = log
    trace = score(task, new_trace())
    assert log == ["m1", "m2 saw m1=None", "r saw m1=2.0 j=None", "judge saw r=Reward(score=0.5, weight=0.5) task=p"]
    assert trace.metrics == {"m1": 2.0, "m2": 1.0}
    assert type(trace.metrics["m1"]) is float
    assert trace.rewards == {"r": Reward(0.5, 0.5), "grade": Reward(1.0, 2.0)}
    assert trace.reward == 2.25


class Failing(Task):
    @metric
    def fine(self) -> float:
        return 1.0

    @reward
    def r_ok(self) -> float:
        return 1.0

    @reward
    async def r_bad(self) -> float:
        raise RuntimeError("boom")


class Verdict(Judge):
    async def score(self, task, trace) -> float:
        return 1.0


def test_b47_failed_scorer_leaves_its_phase_seeded_none_and_keeps_earlier_phases():
    trace = new_trace()
    trace.metrics.update(fine=7.0, other=3.0)
    trace.rewards.update(r_ok=Reward(9.0), kept=Reward(1.0))
    task = Failing({"prompt": "p"}, TaskConfig(judges=[Verdict()]))
    with pytest.raises(TaskError, match=r"^task Failing scoring failed: RuntimeError: boom$"):
        score(task, trace)
    assert trace.metrics == {"fine": 1.0, "other": 3.0}  # metrics phase completed
    # the rewards phase aborted as a whole: nothing recorded; judges never ran
    assert trace.rewards == {"r_ok": None, "r_bad": None, "verdict": None, "kept": Reward(1.0)}


class Mapped(Task):
    @metric
    def stats(self) -> dict:
        return {"stats": 3, "a": 1}

    @metric
    def a_map(self) -> dict:  # processed first: records b before b's own seed is checked
        return {"b": 5}

    @metric
    def b(self) -> dict:  # Q8: b is no longer None, so it is not unseeded
        return {"c": 1}

    @reward(weight=0.5)
    def parts(self) -> dict:
        return {"x": 1.0, "y": 0.0}


def test_b47_mapping_result_unseeds_the_name_and_stores_keys():
    trace = score(Mapped({"prompt": "p"}), new_trace())
    assert trace.metrics == {"stats": 3.0, "a": 1.0, "b": 5.0, "c": 1.0}
    assert list(trace.rewards) == ["x", "y"]
    assert trace.rewards == {"x": Reward(1.0, 0.5), "y": Reward(0.0, 0.5)}


class Plugged(Task):
    @reward(weight=2.0, priority=3)
    def body(self) -> float:
        return 1.0

    @reward(weight=4.0)
    def reweighted(self) -> float:
        return 0.5

    @metric
    def m(self) -> float:
        return 1.0

    @stop
    def done(self, trace: Trace) -> bool:
        return False


def plugged_stop(trace: Trace) -> bool:
    return trace.num_turns >= 1


def test_b49_plugged_config_merges_and_overrides():
    """Port of upstream test_config_plugged_fns_merge_and_override."""
    config = TaskConfig(
        stops={"done": plugged_stop, "extra": plugged_stop},
        metrics={"m": lambda: 2.0, "new_m": lambda trace: 3.0},
        rewards={
            "body": PluggedReward(fn=lambda: 0.25, weight=8.0),
            "reweighted": PluggedReward(weight=3.0),
            "new_r": PluggedReward(fn=lambda task: float(task.prompt == "p")),
        },
    )
    task = Plugged({"prompt": "p"}, config)
    stops = task.hooks("stop")
    assert [(h.name, h.fn) for h in stops] == [("done", plugged_stop), ("extra", plugged_stop)]
    rewards = task.hooks("reward")
    assert [(h.name, h.priority, h.weight) for h in rewards] == [
        ("body", 3, 8.0),
        ("new_r", 0, 1.0),
        ("reweighted", 0, 3.0),
    ]
    trace = score(task, new_trace())
    assert trace.metrics == {"m": 2.0, "new_m": 3.0}
    assert trace.rewards == {"body": Reward(0.25, 8.0), "new_r": Reward(1.0, 1.0), "reweighted": Reward(0.5, 3.0)}


def test_b49_plugged_fn_without_weight_keeps_the_replaced_weight_and_fnless_needs_a_method():
    task = Plugged({"prompt": "p"}, TaskConfig(rewards={"body": PluggedReward(fn=lambda: 0.75)}))
    assert score(task, new_trace()).rewards["body"] == Reward(0.75, 2.0)
    message = "no @reward method named 'nope' on Plugged; give the plugged reward an fn"
    with pytest.raises(ValueError, match=rf"^{re.escape(message)}$"):
        Plugged({"prompt": "p"}, TaskConfig(rewards={"nope": PluggedReward(weight=2.0)}))


def test_b36_plugged_stop_replaces_decorated_stop_in_a_rollout():
    task = Plugged({"prompt": "p"}, TaskConfig(stops={"done": plugged_stop}))
    model = ScriptedModel(default=Reply("more", tool_calls=[("t", {})]))
    trace = run_rollout(task, ScriptedHarness(tools={"t": lambda: "r"}), model)
    assert (trace.stop_condition, trace.num_turns, len(model.requests), trace.ok) == ("done", 1, 1, True)


@pytest.mark.parametrize(
    ("judge", "name"),
    [
        (Verdict(name="grader"), "grader"),
        (Verdict(), "verdict"),
        (type("MyRubricJudge", (Judge,), {})(), "my_rubric"),
        (type("Grader", (Judge,), {})(), "grader"),
        (Judge(), "judge"),
    ],
)
def test_b51_judge_reward_name_fallback(judge, name):
    assert judge.reward_name == name


@pytest.mark.parametrize(
    ("config", "key"),
    [
        (TaskConfig(judges=[Verdict(name="body")]), "body"),  # a decorated reward
        (TaskConfig(rewards={"new": PluggedReward(fn=lambda: 1.0)}, judges=[Verdict(name="new")]), "new"),
        (TaskConfig(judges=[Verdict(), Verdict()]), "verdict"),
    ],
)
def test_b51_duplicate_reward_keys_are_rejected(config, key):
    message = f"duplicate reward key '{key}': name the judge"
    with pytest.raises(ValueError, match=rf"^{re.escape(message)}$"):
        Plugged({"prompt": "p"}, config)


class Unparseable(Judge):
    async def score(self, task, trace) -> float:
        raise ValueError("no verdict in reply")


def test_b51_judge_failure_raises_task_error_and_keeps_the_seed():
    task = Plugged({"prompt": "p"}, TaskConfig(judges=[Verdict(weight=0.25), Unparseable()]))
    trace = new_trace()
    with pytest.raises(TaskError, match=r"^task Plugged scoring failed: ValueError: no verdict in reply$"):
        score(task, trace)
    assert trace.rewards == {
        "body": Reward(1.0, 2.0),
        "reweighted": Reward(0.5, 4.0),
        "verdict": None,
        "unparseable": None,
    }


def test_b51_unimplemented_judge_score_is_a_task_error():
    Bare = type("BareJudge", (Judge,), {})
    message = r"^task Task scoring failed: NotImplementedError: BareJudge\.score is not implemented$"
    with pytest.raises(TaskError, match=message):
        score(Task({"prompt": "p"}, TaskConfig(judges=[Bare()])), new_trace())


class NeedsRuntime(Task):
    @metric
    def m_rt(self, runtime) -> float:
        return 1.0 if runtime == "box" else 0.0

    @metric
    def m_task(self, task) -> float:
        return float(isinstance(task, TaskData) and task is self.data)

    @reward
    def r_rt(self, trace, runtime) -> float:
        return 1.0

    @reward
    def r_opt(self, runtime=None) -> float:
        return 0.5 if runtime is None else 1.0


def test_b47_without_runtime_hooks_requiring_it_are_skipped(caplog):
    caplog.set_level(logging.INFO, logger="rollout_ray")
    trace = score(NeedsRuntime({"prompt": "p"}), new_trace())
    assert trace.metrics == {"m_task": 1.0}
    assert trace.rewards == {"r_opt": Reward(0.5)}
    skipped = [r.getMessage() for r in caplog.records if "scoring skipped" in r.getMessage()]
    assert sorted(skipped) == [
        "scoring skipped: hook=m_rt reason=needs-runtime",
        "scoring skipped: hook=r_rt reason=needs-runtime",
    ]
    trace = score(NeedsRuntime({"prompt": "p"}), new_trace(), runtime="box")
    assert trace.metrics == {"m_rt": 1.0, "m_task": 1.0}
    assert trace.rewards == {"r_opt": Reward(1.0), "r_rt": Reward(1.0)}


class MetricHarness(ScriptedHarness):
    @metric
    def h_turns(self, trace: Trace) -> float:
        return trace.num_turns

    @metric
    def h_map(self, runtime) -> dict:
        return {"h/alive": float(runtime is not None)}


def test_b48_harness_metrics_share_trace_metrics():
    trace = new_trace()
    trace.metrics["h_map"] = 9.0
    asyncio.run(MetricHarness().score(trace))  # no runtime: h_map is skipped
    assert trace.metrics == {"h_turns": 0.0, "h_map": 9.0}
    trace = run_rollout(NeedsRuntime({"prompt": "p"}), MetricHarness())
    assert trace.ok
    assert trace.metrics == {"m_rt": 0.0, "m_task": 1.0, "h_turns": 1.0, "h/alive": 1.0}


class TaskAwareHarness(ScriptedHarness):
    @metric
    def prompt_len(self, task) -> float:
        return len(task.prompt)


def test_b48_harness_metric_receives_the_task_data():
    """B48: harness metrics run with {"task": data, "trace", "runtime"}."""
    trace = run_rollout(Task({"prompt": "four"}), TaskAwareHarness())
    assert trace.errors == []
    assert trace.metrics == {"prompt_len": 4.0}


def test_b48_harness_metric_failure_is_a_harness_error():
    class Broken(ScriptedHarness):
        @metric
        def bad(self) -> float:
            return 1 / 0

    message = r"^harness 'scripted' metric failed: ZeroDivisionError: division by zero$"
    with pytest.raises(HarnessError, match=message):
        asyncio.run(Broken().score(new_trace()))


def test_b47_offline_scoring_skips_judges_that_need_a_runtime():
    from rollout_ray import Judge, TaskConfig

    class BoxJudge(Judge):
        async def score(self, task, trace, runtime):  # type: ignore[no-untyped-def]
            return 1.0

    class Plain(Judge):
        async def score(self, task, trace):  # type: ignore[no-untyped-def]
            return 0.5

    task = Task({"prompt": "x"}, TaskConfig(judges=[BoxJudge(), Plain()]))
    trace = new_trace()
    asyncio.run(task.score(trace, None))
    assert trace.rewards == {"plain": Reward(0.5)}
