"""Hook routing by annotation (B4, B5) and decorator discovery (B50).

This module uses ``from __future__ import annotations``: every hook below is annotated with
*strings*, so routing through them proves string annotations are resolved.
"""

from __future__ import annotations

import re

import pytest

from rollout_ray import (
    Request,
    Response,
    Rollout,
    Task,
    TaskConfig,
    Trace,
    TraceTask,
    UserMessage,
    intercept,
    metric,
    reward,
    stop,
)
from rollout_ray._core.hooks import boundary_of, call_by_type, discover
from rollout_ray.testing import MemoryRuntime, ScriptedHarness, ScriptedModel


def on_request(request: Request): ...
def on_response(response: Response): ...
def on_request_and_trace(trace: Trace, request: Request): ...
def on_response_and_trace(response: Response, trace: Trace): ...
def only_trace(trace: Trace): ...
def both_sides(request: Request, response: Response): ...
def unannotated(request, response): ...
def two_traces(a: Trace, b: Trace): ...
def request_and_two_traces(r: Request, a: Trace, b: Trace): ...
def no_boundary(x: int, y: str): ...
def unannotated_extra(ctx, request: Request, n: int = 0): ...


def test_b5_annotations_in_this_module_are_strings():
    assert on_request.__annotations__ == {"request": "Request"}


@pytest.mark.parametrize("allow_trace", [False, True])
@pytest.mark.parametrize(
    ("fn", "side"),
    [
        (on_request, Request),
        (on_response, Response),
        (on_request_and_trace, Request),
        (on_response_and_trace, Response),
        (unannotated_extra, Request),
    ],
)
def test_b5_one_request_or_response_parameter_is_the_boundary(fn, side, allow_trace):
    """B5(a): one Request/Response plus at most one Trace; unannotated params are ignored."""
    assert boundary_of(fn, allow_trace=allow_trace) is side


def test_b5_trace_only_stop_is_a_trace_hook():
    """B5(b)."""
    assert boundary_of(only_trace, allow_trace=True) is Trace


INTERCEPTOR_MSG = "{} must have exactly one Request or Response parameter"
STOP_MSG = "{} must have exactly one Request, Response, or Trace parameter"


@pytest.mark.parametrize(
    ("fn", "allow_trace", "template"),
    [
        (only_trace, False, INTERCEPTOR_MSG),  # an interceptor cannot take the Trace alone
        (both_sides, False, INTERCEPTOR_MSG),
        (both_sides, True, STOP_MSG),
        (unannotated, False, INTERCEPTOR_MSG),
        (unannotated, True, STOP_MSG),
        (two_traces, True, STOP_MSG),
        (two_traces, False, INTERCEPTOR_MSG),
        (request_and_two_traces, True, STOP_MSG),
        (no_boundary, True, STOP_MSG),
        (no_boundary, False, INTERCEPTOR_MSG),
    ],
)
def test_b5_bad_shapes_raise_type_error_naming_the_function(fn, allow_trace, template):
    with pytest.raises(TypeError, match=rf"^{re.escape(template.format(fn.__qualname__))}$"):
        boundary_of(fn, allow_trace=allow_trace)
    with pytest.raises(TypeError, match=rf"^{re.escape(template.format('my_hook'))}$"):
        boundary_of(fn, allow_trace=allow_trace, name="my_hook")


def _define(source: str, namespace: dict) -> dict:
    """Run ``source`` without this module's ``from __future__ import annotations``."""
    exec(compile(source, "<hooks>", "exec", dont_inherit=True), namespace)
    return namespace


def test_b5_unresolvable_string_annotations_route_by_name():
    """A forward reference that cannot be resolved falls back to matching the raw names."""
    ns = _define("def hook(request: 'Request', extra: 'NoSuchType'): pass\ndef stop_hook(trace: 'Trace'): pass", {})
    assert ns["hook"].__annotations__ == {"request": "Request", "extra": "NoSuchType"}
    assert boundary_of(ns["hook"], allow_trace=False) is Request
    assert boundary_of(ns["stop_hook"], allow_trace=True) is Trace


def test_b5_real_class_annotations_route():
    ns = _define("def hook(trace: Trace, response: Response): pass", {"Response": Response, "Trace": Trace})
    assert ns["hook"].__annotations__["response"] is Response
    assert boundary_of(ns["hook"], allow_trace=False) is Response


class RoutedTask(Task):
    @intercept
    def req_i(self, request: Request): ...
    @intercept
    def resp_i(self, response: Response, trace: Trace): ...
    @stop
    def req_s(self, request: Request, trace: Trace) -> bool:
        return False

    @stop
    def resp_s(self, response: Response) -> bool:
        return False

    @stop
    def trace_s(self, trace: Trace) -> bool:
        return False


def rollout_of(task: Task, seen: list[Trace] | None = None) -> Rollout:
    return Rollout(
        task,
        ScriptedHarness(),
        model=ScriptedModel(default="x"),
        runtime_factory=MemoryRuntime,
        on_trace=None if seen is None else seen.append,
    )


def _names(hooks) -> list[str]:
    return [h.name for h in hooks]


def test_b4_rollout_routes_interceptors_and_stops_by_boundary():
    task = RoutedTask({"prompt": "p"}, TaskConfig(stops={"plugged": only_trace}))
    s = rollout_of(task).session
    assert _names(s.request_interceptors) == ["req_i"]
    assert _names(s.response_interceptors) == ["resp_i"]
    assert _names(s.request_stops) == ["req_s"]
    assert _names(s.response_stops) == ["resp_s"]
    assert _names(s.trace_stops) == ["plugged", "trace_s"]


class TraceOnlyInterceptor(Task):
    @intercept
    def peek(self, trace: Trace): ...


class UnannotatedStop(Task):
    @stop
    def done(self, trace) -> bool:
        return True


class TwoSidedStop(Task):
    @stop
    def both(self, request: Request, response: Response) -> bool:
        return True


@pytest.mark.parametrize(
    ("task", "message"),
    [
        (TraceOnlyInterceptor({"prompt": "p"}), INTERCEPTOR_MSG.format("peek")),
        (UnannotatedStop({"prompt": "p"}), STOP_MSG.format("done")),
        (TwoSidedStop({"prompt": "p"}), STOP_MSG.format("both")),
        # Q21: plugged stops are classified by annotation too
        (Task({"prompt": "p"}, TaskConfig(stops={"plugged": lambda trace: False})), STOP_MSG.format("plugged")),
    ],
)
def test_b4_q1_bad_hook_raises_from_constructor_after_on_trace(task, message):
    seen: list[Trace] = []
    with pytest.raises(TypeError, match=rf"^{re.escape(message)}$"):
        rollout_of(task, seen)
    [trace] = seen  # Q1: observers saw a trace that will never complete
    assert (trace.task.type, trace.is_completed, trace.ok) == (type(task).__name__, False, False)


class Base(Task):
    @reward(weight=2.0)
    def overridden(self) -> float:
        return 1.0

    @metric
    def hidden(self) -> float:
        return 1.0

    @metric(priority=-1)
    def low(self) -> float:
        return 0.0

    @metric
    def b_metric(self) -> float:
        return 0.0


class Child(Base):
    @reward(weight=3.0)
    def overridden(self) -> float:
        return 5.0

    def hidden(self) -> float:
        return 9.0  # undecorated override hides the decorated base

    @metric(priority=5)
    def z_first(self) -> float:
        return 0.0

    @metric
    def a_metric(self) -> float:
        return 0.0


def test_b50_discovery_sorts_by_descending_priority_then_name():
    child = Child({"prompt": "p"})
    assert _names(discover(child, "metric")) == ["z_first", "a_metric", "b_metric", "low"]
    assert [h.priority for h in discover(child, "metric")] == [5, 0, 0, -1]
    assert _names(discover(Base({"prompt": "p"}), "metric")) == ["b_metric", "hidden", "low"]


def test_b50_most_derived_override_wins():
    [hook] = discover(Child({"prompt": "p"}), "reward")
    assert (hook.name, hook.weight, hook.fn()) == ("overridden", 3.0, 5.0)
    [base_hook] = discover(Base({"prompt": "p"}), "reward")
    assert (base_hook.weight, base_hook.fn()) == (2.0, 1.0)


def test_b50_undecorated_override_hides_decorated_base_method():
    assert "hidden" not in _names(discover(Child({"prompt": "p"}), "metric"))
    assert discover(Child({"prompt": "p"}), "stop") == []


def test_b50_task_hooks_merge_plugged_stops_in_sorted_order():
    class Stops(Task):
        @stop(priority=1)
        def urgent(self, trace: Trace) -> bool:
            return False

        @stop
        def mid(self, trace: Trace) -> bool:
            return False

    task = Stops({"prompt": "p"}, TaskConfig(stops={"aa": only_trace, "zz": only_trace}))
    assert _names(task.hooks("stop")) == ["urgent", "aa", "mid", "zz"]


def test_b50_call_by_type_passes_values_by_annotated_type():
    got = {}

    def hook(t: Trace, r: Request, other: int = 4):
        got.update(t=t, r=r, other=other)
        return "done"

    trace, request = Trace(task=TraceTask(type="T")), Request([UserMessage("u")])
    assert call_by_type(hook, {Request: request, Trace: trace, Response: object()}) == "done"
    assert got == {"t": trace, "r": request, "other": 4}
    assert got["t"] is trace and got["r"] is request
