"""OpenTelemetry spans of each rollout attempt, built in the driver from its returned trace.

One ``rollout`` span per attempt, with a child per phase the trace timed (boot, setup, agent,
finalize, scoring) and, under ``agent``, one per model call; each carries the rollout id and
task as attributes. The spans are made from the trace's recorded times once it is back, so
they come from the process where the user configured OpenTelemetry (the driver), whichever
executor ran the rollout, and the rollout's own code waits on nothing for them.

Nothing happens unless OpenTelemetry is installed (the ``[otel]`` extra) and the user set a
tracer provider that records (``trace.set_tracer_provider`` with an exporter, or
``opentelemetry-instrument``): the API's default provider records nothing, and that is checked
once per rollout before any span is built.
"""

from __future__ import annotations

import time
from typing import Any

from .._record.trace import Trace

try:
    from opentelemetry import trace as otel
except ImportError:  # the optional [otel] extra is absent: spans are off
    otel = None  # type: ignore[assignment]

TRACER_NAME = "rollout_ray"
_tracer = None if otel is None else otel.get_tracer(TRACER_NAME)
"""Got once (~20 us a call): the API's proxy hands on to the provider the user sets later."""


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _end(trace: Trace, start: float) -> float:
    """When the rollout's last recorded span or call ended (epoch seconds)."""
    ends = [s.end for s in trace.timing.spans().values()] + [c.time.end for c in trace.calls]
    return max(start, *ends)


def rollout_attributes(trace: Trace, run_id: str | None, attempt: int) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "rollout.id": trace.id,
        "rollout.task": trace.task.type,
        "rollout.attempt": attempt,
        "rollout.ok": trace.ok,
    }
    optional = {
        "rollout.run_id": run_id,
        "rollout.task_idx": trace.task.idx,
        "rollout.task_key": trace.task.key,
        "rollout.reward": trace.reward,
        "rollout.stop_condition": trace.stop_condition,
        "rollout.error_type": trace.last_error.type if trace.last_error else None,
    }
    attributes.update((k, v) for k, v in optional.items() if v is not None)
    return attributes


def export_rollout(trace: Trace, *, run_id: str | None = None, attempt: int = 0) -> None:
    """Emit ``trace``'s spans to the configured tracer provider; nothing if there is none."""
    tracer = _tracer
    if tracer is None:  # no [otel] extra
        return
    start = trace.timing.start or time.time()  # 0: a trace that never ran (e.g. its spec did not pickle)
    root = tracer.start_span("rollout", start_time=_ns(start))
    if not root.is_recording():
        return
    end, ids = _end(trace, start), {"rollout.id": trace.id, "rollout.task": trace.task.type}
    root.set_attributes(rollout_attributes(trace, run_id, attempt))
    if not trace.ok and trace.last_error is not None:
        root.set_status(otel.Status(otel.StatusCode.ERROR, f"{trace.last_error.type}: {trace.last_error.message}"))
    in_root = otel.set_span_in_context(root)
    for phase, span in trace.timing.spans().items():
        if not span.start:
            continue
        child = tracer.start_span(f"rollout.{phase}", context=in_root, start_time=_ns(span.start), attributes=ids)
        if phase == "agent":
            _model_calls(tracer, trace, otel.set_span_in_context(child), ids)
        child.end(end_time=_ns(span.end or end))
    root.end(end_time=_ns(end))


def _model_calls(tracer: Any, trace: Trace, context: Any, ids: dict[str, Any]) -> None:
    """The model calls inside the agent phase."""
    assert otel is not None
    for call in trace.calls:
        if not call.time.start:
            continue
        extra = {"model.name": call.model, "model.finish_reason": call.finish_reason}
        attributes = {**ids, **{k: v for k, v in extra.items() if v is not None}}
        span = tracer.start_span(
            "rollout.model_call", context=context, start_time=_ns(call.time.start), attributes=attributes
        )
        if call.error is not None:
            span.set_status(otel.Status(otel.StatusCode.ERROR, f"{call.error.type}: {call.error.message}"))
        span.end(end_time=_ns(call.time.end or call.time.start))
