"""Rollout: the lifecycle of one agent run — open, step × N, close (or abort).

This is the verifiers v1 ``Rollout`` (B1–B32, B41–B46) in plain asyncio; actors host it and
add no lifecycle logic. Every failure inside is recorded once on the trace and ``open`` /
``step`` return False; only caller bugs (a borrowed runtime already torn down) and
cancellation are raised.

Deliberate differences from upstream, each keeping the observable outcome:
* task and harness scoring run under a task group, so when one raises the other is cancelled
  instead of writing metrics after ``close`` returned (Q6); the first error is recorded.
* a task that declares tool servers in a rollout with no tool server fails with
  ``ToolsetError`` instead of running without its tools.
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import Any

from .._errors import (
    InfrastructureLost,
    RolloutError,
)
from .._record.messages import Message, Request
from .._record.trace import AgentInfo, Timing, Trace
from .harness import Harness, HarnessSession
from .hooks import classify
from .interception import Interception, LocalInterception
from .limits import RolloutLimits, RolloutTimeouts
from .model import Model
from .phases import Segment, finalize_and_score
from .policy_gate import PolicyGate, SegmentClock, process_gate
from .rollout_open import RolloutOpen
from .runtime import Runtime
from .session import RolloutSession
from .state import initial_state
from .task import Task
from .tools import LocalTools
from .user_sim import UserSimulator, converse

log = logging.getLogger("rollout_ray")

ToolServerFactory = Callable[..., Any]
"""Serves a task's toolsets: ``(toolsets, runtime, state_secret, *, on_call)`` → an async
context manager yielding ``{server name: url}``; ``on_call`` receives each ``ToolCallRecord``
(e.g. ``ToolServer.serve``)."""


TEARDOWN_TIMEOUT = 60.0
"""Seconds each step of a rollout's teardown may take (closing the harness session, leaving
the services, the harness's cleanup, stopping an owned runtime): a step that hangs is logged
and left behind, and the rollout still returns its trace (docs/lifecycle.md B41). The phases
before it have budgets of their own (``RolloutTimeouts``)."""


def _now() -> float:
    return time.time()


@asynccontextmanager
async def _teardown_step(rollout_id: str, what: str) -> AsyncIterator[None]:
    """Bound one teardown step by ``TEARDOWN_TIMEOUT``; a step that overruns is logged, not
    raised (a runtime's stop goes on in the background: it is shielded)."""
    deadline = asyncio.timeout(TEARDOWN_TIMEOUT)
    try:
        async with deadline:
            yield
    except TimeoutError:
        if not deadline.expired():
            raise  # the step's own, not the bound's
        log.warning("rollout %s: %s did not finish within %gs; left behind", rollout_id, what, TEARDOWN_TIMEOUT)


class Rollout(RolloutOpen):
    """One agent run on one task.

    Args:
        task: the task (data + hooks).
        harness: the agent program.
        model: the upstream model the interception forwards to.
        runtime: a live runtime to *borrow*; ``None`` makes the rollout build, start and stop
            its own with ``runtime_factory(trace.id)``.
        runtime_factory: builds an owned runtime from its name (``LocalRuntime``,
            ``SandboxRuntime``, ...), and ``image=`` / ``kind=`` / ``resources=`` when the task
            has an image, a runtime kind (or ``runtime_kind`` is given) or resources
            (``TaskData``); required unless ``runtime`` is given.
        runtime_kind: the kind of the runtime it owns when its task names none
            (``EvalConfig.runtime``); ``None``: the factory's own.
        interception: serves the session to a program's harness (default: a private in-process
            one); an ``in_process`` harness is always served in process (one given is
            not used: a warning says so).
        tool_server: serves the task's toolsets over HTTP to a program; required only when
            the task declares some and the harness is not ``in_process``.
        limits: turn and token caps.
        timeouts: phase timeouts; unset ones fall back to the task data's ``timeout``.
        model_name / sampling: forced on every model request.
        has_user: a caller feeds user turns (an interaction), so a prompt-less task is valid.
        on_trace: called with the trace as soon as it is minted.
        policy: the policy version and pause its model calls and agent clock obey
            (``_core/policy_gate``; default: the process's).

    Raises:
        TypeError: a ``@stop`` or ``@intercept`` hook has the wrong parameter shape (B5), or
            neither ``runtime`` nor ``runtime_factory`` was given.
    """

    def __init__(
        self,
        task: Task,
        harness: Harness,
        *,
        model: Model,
        runtime: Runtime | None = None,
        runtime_factory: Callable[[str], Runtime] | None = None,
        runtime_kind: str | None = None,
        interception: Interception | None = None,
        tool_server: ToolServerFactory | None = None,
        limits: RolloutLimits | None = None,
        timeouts: RolloutTimeouts | None = None,
        model_name: str | None = None,
        sampling: dict[str, Any] | None = None,
        has_user: bool = False,
        on_trace: Callable[[Trace], None] | None = None,
        policy: PolicyGate | None = None,
    ) -> None:
        if runtime is None and runtime_factory is None:
            raise TypeError(
                "Rollout needs runtime= (a live runtime to borrow) or runtime_factory= "
                "(to own one, e.g. runtime_factory=LocalRuntime)"
            )
        self.task = task
        self.harness = harness
        self.trace = Trace(
            task=task.trace_task(),
            agent=AgentInfo(harness=harness.id, model=model_name or model.name),
            timing=Timing(start=_now()),
            state=initial_state(task.state_type),
        )
        if on_trace is not None:
            on_trace(self.trace)
        self.timeouts = (timeouts or RolloutTimeouts()).merged(task.data.timeout)
        self.remaining_agent_budget: float | None = self.timeouts.agent
        """Agent seconds left; charged only while a segment runs (B2, B24)."""
        self.policy = policy or process_gate()
        self._clock: SegmentClock | None = None
        self.owns_runtime = runtime is None
        self.runtime = runtime
        self._runtime_factory = runtime_factory
        self._runtime_kind = runtime_kind
        # An in-process agent talks to its session directly: no proxy hop, one trace.
        if interception is not None and harness.in_process:
            warnings.warn(
                f"Rollout: interception= is not used: the harness {harness.id!r} runs in process and "
                "talks to its session directly",
                stacklevel=2,
            )
        self.interception = interception if interception is not None and not harness.in_process else LocalInterception()
        self._local_tools: LocalTools | None = None
        self._tool_server = tool_server
        self.has_user = has_user
        self.session = RolloutSession(
            self.trace,
            model,
            limits=limits,
            model_name=model_name,
            sampling=sampling,
            policy=self.policy,
            state_type=task.state_type,
            **classify(task),
        )
        self.harness_session: HarnessSession | None = None
        self._stack = AsyncExitStack()
        self._opened = self._closed = self._failed = False
        self._unsettled: Segment | None = None
        self._user: UserSimulator | None = None
        """The task's simulated user, built in ``open``; ``run`` converses with it."""
        self.failure: BaseException | None = None
        """The latest failure recorded by ``fail``."""

    @property
    def ok(self) -> bool:
        """Neither failed nor stopped: the exchange may continue."""
        return not self._failed and not self.trace.stopped

    # -- fail / abort -----------------------------------------------------------------------

    def fail(self, error: BaseException) -> None:
        """Record ``error`` as the rollout's failure (B20).

        Raises:
            ValueError: the borrowed runtime was stopped by its owner mid-run.
        """
        if not self.owns_runtime and self.runtime is not None and self.runtime.stopped:
            raise ValueError(f"borrowed runtime {self.runtime.name!r} was torn down by its owner mid-run") from error
        if not isinstance(error, RolloutError | InfrastructureLost):
            log.warning("rollout %s: unexpected %s", self.trace.id, type(error).__name__, exc_info=error)
        self._failed = True
        self.failure = error
        self.trace.record_error(error)

    async def abort(self) -> None:
        """Release everything without finalizing or scoring (B21). Safe after a partial close."""
        self._closed = True
        await self._leave_services()
        await self._clean_runtime()

    # -- step -------------------------------------------------------------------------------

    async def step(self, messages: Sequence[Message] | None = None) -> bool:
        """Run one segment; returns whether the exchange can continue (B22–B32).

        Args:
            messages: the caller's new user turns; ``None`` launches the harness.
        """
        segment = await self._run_segment(messages)
        if segment is None:
            return False
        try:
            await self.interception.sync(self.session)
        except Exception as e:  # noqa: BLE001 - any sync failure loses the segment: the rollout fails with it
            # What the proxy committed in this segment is out of reach: the run is lost.
            self.fail(e)
            return False
        return self._settle(segment)

    async def _run_segment(self, messages: Sequence[Message] | None) -> Segment | None:
        """The segment itself, charged to the agent budget; ``None`` if none may run."""
        if not self._opened or self._closed or not self.ok or self.harness_session is None:
            return None
        segment = Segment(self.trace.num_turns)
        # Paused time (a weight update) is not charged: the clock stands still (_core/policy_gate).
        clock = self._clock = SegmentClock(self.policy, self.remaining_agent_budget)
        try:
            async with clock.timeout():
                await self._segment(messages)
        except Exception as e:  # noqa: BLE001 - the segment's exception is judged by the caller (expired or failed)
            segment.raised = e
            segment.expired = clock.expired()
        finally:
            clock.close()
            if self.remaining_agent_budget is not None:
                self.remaining_agent_budget = max(0.0, self.remaining_agent_budget - clock.spent())
            self._clock = None
        return segment

    @property
    def deadline_at(self) -> float | None:
        """Loop-time deadline of the running segment, ``None`` between segments (B23); a
        pause of the policy moves it out by its length."""
        return None if self._clock is None else self._clock.deadline

    def _settle(self, segment: Segment) -> bool:
        """Record how a segment ended, once the trace holds what its proxy committed."""
        if segment.raised is not None:
            failure = segment.failure(self.session, self.timeouts.agent)
            if failure is not None:
                self.fail(failure)
            return False
        if self.session.error is not None:
            self.fail(self.session.error)
            return False
        return self.ok and self.trace.num_turns > segment.turns_before

    async def _segment(self, messages: Sequence[Message] | None) -> None:
        assert self.harness_session is not None
        if messages is not None and self.session.request_interceptors:
            request = await self.interception.prepare_users(self.session, Request(list(messages)))
            messages = request.messages
            if self.session.stopped:
                return
        await self.harness_session.turn(messages)

    # -- close ------------------------------------------------------------------------------

    async def close(self) -> Trace:
        """Finish in order: harness session, services, finalize, scoring, runtime (B41).

        Idempotent: a second call (or a call after ``abort``) returns the trace unchanged.
        Failed runs are neither finalized nor scored; stopped runs are.
        """
        if self._closed:
            return self.trace
        self._closed = True
        try:
            try:
                await self._close_harness_session()
                try:
                    await self._stack.aclose()
                finally:
                    agent = self.trace.timing.agent
                    if agent.start and not agent.end:
                        agent.end = _now()
                if self._unsettled is not None:  # run(): the sync came with the unregister
                    self._settle(self._unsettled)
                    if self.ok:
                        self.trace.stop("agent_completed")
                if not self._failed and self._opened:
                    await finalize_and_score(self.task, self.harness, self.trace, self.runtime, self.timeouts)
            except Exception as e:  # noqa: BLE001 - a scorer's failure is this rollout's, not the run's
                self.fail(e)
        finally:
            await self._teardown()
        self._log_done()
        return self.trace

    async def _close_harness_session(self) -> None:
        if self.harness_session is None:
            return
        try:
            async with _teardown_step(self.trace.id, "closing the harness session"):
                await self.harness_session.close()
        except Exception:
            # The trajectory is complete; a transport teardown failure must not discard it.
            log.warning("rollout %s: harness session close failed", self.trace.id, exc_info=True)

    async def _teardown(self) -> None:
        await self._leave_services()
        trace = self.trace
        trace.is_completed = True
        trace.ok = not self._failed
        trace.timing.end_open_spans(_now())
        trace.split_agent_time()
        await self._clean_runtime()

    async def _leave_services(self) -> None:
        """Close the harness session and leave the tool servers and the interception."""
        await self._close_harness_session()
        with suppress(Exception):
            async with _teardown_step(self.trace.id, "leaving the services"):
                await self._stack.aclose()

    async def _clean_runtime(self) -> None:
        """Harness cleanup, then stop an owned runtime: last, since env-level judging after
        close needs only the traces (B43)."""
        if self.runtime is None:
            return
        # Now it knows what it ran over: its image's digest, the setup snapshot it started from.
        self.trace.agent.runtime = self.runtime.info(borrowed=not self.owns_runtime)
        try:
            async with _teardown_step(self.trace.id, "the harness's cleanup"):
                await self.harness.cleanup(self.trace, self.runtime)
        except Exception:
            log.warning("rollout %s: harness cleanup failed", self.trace.id, exc_info=True)
        if self.owns_runtime:
            try:
                async with _teardown_step(self.trace.id, "stopping the runtime"):
                    await self.runtime.stop()
            except Exception:
                log.warning("rollout %s: runtime teardown failed", self.trace.id, exc_info=True)

    def _log_done(self) -> None:
        trace = self.trace
        stop = trace.last_error.type if trace.last_error else trace.stop_condition
        log.info(
            "rollout done: id=%s task=%s reward=%.3f turns=%d stop=%s",
            trace.id,
            self.task.data.idx,
            trace.reward,
            trace.num_turns,
            stop,
        )

    # -- the whole run ----------------------------------------------------------------------

    async def run(self) -> Trace:
        """open → one step → ``agent_completed`` if still ok → close; abort on cancellation.
        With a simulated user (``Task.user_simulator``), steps until the conversation ends.

        The step's sync is left to ``close``: leaving the interception brings back the same
        delta, so a rollout served in another process pays one call fewer. Nothing runs in
        between but closing the harness session, which does not read the trace.
        """
        try:
            if await self.open():
                if self._user is None:
                    self._unsettled = await self._run_segment(None)
                else:
                    await converse(self, self._user)
                    if self.ok:
                        self.trace.stop("agent_completed")
            return await self.close()
        except BaseException:
            await self.abort()
            raise
