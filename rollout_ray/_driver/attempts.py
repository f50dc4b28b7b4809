"""One sample run until it is not lost: the driver's retries of infrastructure losses.

A rollout whose host or services were lost under it (an ``InfrastructureLost`` on its trace)
says nothing of the task, so it is run again, up to ``retries`` times (and, with
``retry_failed``, one that failed inside). The trace kept is the last attempt's, carrying
the errors of every earlier attempt first (B52), with how many each attempt left.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .._errors import InfrastructureLost
from .._hosting.executor import failed_trace
from .._hosting.spec import RolloutSpec
from .._record.arrow import RolloutRecord
from .._record.trace import Trace
from .otel import export_rollout


def lost(trace: Trace) -> bool:
    """Whether a rollout's host or services were lost under it (an ``InfrastructureLost`` among
    its errors): its outcome says nothing of the task, so it is run again."""
    return not trace.ok and any(error.is_a(InfrastructureLost) for error in trace.errors)


async def run_attempts(
    run: Callable[[RolloutSpec], Awaitable[Trace]],
    spec: Callable[[], RolloutSpec],
    earlier: RolloutRecord | None,
    *,
    retries: int,
    retry_failed: bool,
    on_retry: Callable[[], None],
    run_id: str | None = None,
) -> tuple[Trace, int, tuple[int, ...]]:
    """Run ``spec()`` with ``run`` (``Steering.run``: the executor's, steerable) until it is not
    lost (or ``retries`` are spent).

    Returns its trace, carrying the errors of every earlier attempt first (``earlier``: a
    resumed run's stored record, whose attempts come first and are numbered on from), the
    trace's attempt number and how many errors each attempt left (``RolloutRecord.attempts``).
    ``on_retry`` is called before each retry. Each attempt's trace becomes OpenTelemetry
    spans (``otel``; ``run_id`` is their attribute), when the user configured a provider.
    """
    history = earlier.attempt_errors() if earlier is not None else []
    errors = [e for attempt_errors in history for e in attempt_errors]
    counts = [len(attempt_errors) for attempt_errors in history]
    attempt = earlier.attempt + 1 if earlier is not None else 0
    retried = 0
    while True:
        this = spec()
        try:
            trace, ran = await run(this), True
        except Exception as e:  # noqa: BLE001 - e.g. a task that cannot be pickled: this rollout fails, not the run
            trace, ran = failed_trace(this, e), False
        export_rollout(trace, run_id=run_id, attempt=attempt)
        retryable = lost(trace) or (ran and retry_failed and not trace.ok)
        counts.append(len(trace.errors))
        if not retryable or retried >= retries:
            trace.errors[:0] = errors  # earlier attempts first (B52)
            return trace, attempt, tuple(counts)
        errors.extend(trace.errors)
        attempt += 1
        retried += 1
        on_retry()
