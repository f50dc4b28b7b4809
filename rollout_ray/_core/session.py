"""RolloutSession: the per-rollout state behind the model boundary (B33–B40, §5.2).

Every model request of a rollout goes through ``chat``:

    released? stopped? → limit reservation → limits → trace @stops → request @intercepts → request @stops
    → policy gate (waits while paused) → the fields that go upstream → model call (continued
    across interrupts) → response @intercepts → response @stops → commit the turn with its usage

The fields that go upstream (``_core/upstream_fields``): the operator's ``sampling`` over the
harness's allowed fields, the reply's length clamped to the rollout's token budget left; the
rest is dropped and recorded on the call (``ModelCall.dropped``). The model call
(``_core/generation``) may be interrupted by a weight update and continued from its partial
output; the model is told the token ids the branch already has (``_core/token_prefix``) so
a token-in client builds the prompt from them.

A refusal raises ``TurnRefused`` (HTTP 400 ``rollout stopped: <name>``) and stops the trace;
a released session raises ``SessionConcluded`` (409) and never commits a late turn. Failures
of hooks and of the provider are *stashed* in ``error`` before being raised, so the rollout
can prefer them over the harness's own exit (B30, B31). The HTTP proxy (a later layer) only
adapts this object to the wire; in-process harnesses call it directly. The hooks of each side
(``@intercept`` and ``@stop`` on requests and responses) run in ``_core/turn_hooks``.

The session is confined to one event loop and is its trace's only writer while the rollout
runs; concurrent requests of one rollout interleave only at ``await`` points.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from .._errors import (
    OverlongPromptError,
    Refusal,
    RolloutError,
    SessionConcluded,
    TaskError,
    TurnRefused,
    UpstreamError,
)
from .._record.graph import ConversationGraph
from .._record.messages import Request, Response
from .._record.tokens import record_tokens
from .._record.trace import ErrorRecord, ModelCall, TimeSpan, Trace
from .generation import generate
from .hooks import Hook, call_by_type, resolve
from .limit_reservations import LimitReservations
from .limits import RolloutLimits
from .model import SESSION_ID, Model
from .policy_gate import PolicyGate, process_gate
from .sampling import SAMPLING_FIELDS
from .token_prefix import TokenPrefix
from .turn_hooks import TurnHooks
from .upstream_fields import upstream_fields

_T = TypeVar("_T")


class RolloutSession(TurnHooks):
    """The model boundary of one rollout.

    Args:
        trace: the rollout's live trace.
        model: the upstream model.
        limits: turn and token caps.
        trace_stops: ``@stop`` hooks typed ``Trace``, checked before every turn.
        request_stops / response_stops: ``@stop`` hooks typed ``Request`` / ``Response``.
        request_interceptors / response_interceptors: ``@intercept`` hooks of each side.
        model_name: the model name forced on every request.
        sampling: sampling settings overlaid on every request.
        policy: the policy version each call records and the pause it waits out
            (``_core/policy_gate``; default: the process's).
        state_type: the task's ``state_type``, which every ``PUT /state`` validates into
            (``_core/state``; ``None``: any JSON object).
    """

    def __init__(
        self,
        trace: Trace,
        model: Model,
        *,
        limits: RolloutLimits | None = None,
        trace_stops: Sequence[Hook] = (),
        request_stops: Sequence[Hook] = (),
        response_stops: Sequence[Hook] = (),
        request_interceptors: Sequence[Hook] = (),
        response_interceptors: Sequence[Hook] = (),
        model_name: str | None = None,
        sampling: dict[str, Any] | None = None,
        policy: PolicyGate | None = None,
        state_type: type[BaseModel] | None = None,
    ) -> None:
        self.trace = trace
        self.state_type = state_type
        self.model = model
        self.limits = limits or RolloutLimits()
        self.trace_stops = list(trace_stops)
        self.request_stops = list(request_stops)
        self.response_stops = list(response_stops)
        self.request_interceptors = list(request_interceptors)
        self.response_interceptors = list(response_interceptors)
        self.model_name = model_name or model.name
        self.sampling = dict(sampling or {})
        self.policy = policy or process_gate()
        self.graph = ConversationGraph(trace)
        self.token_prefix = TokenPrefix(trace, self.graph)
        """The ids a request's branch already has, told to a token-in model (``_core/token_prefix``)."""
        self.error: RolloutError | None = None
        """The latest model, tool or hook failure, stashed for the rollout (B30, B31)."""
        self.released = False
        # Through a weak proxy: a session and its reservations in a reference cycle would outlive
        # the rollout until a full garbage collection (the largest GC cost per rollout).
        me = weakref.proxy(self)
        self.reservations = LimitReservations(self.limits, lambda: me.trace.num_turns, lambda: me._check_open())
        """Requests in flight count against the limits (see ``_core/limit_reservations``)."""
        self.prepared: set[bytes] = set()
        """Hashes of user turns already rewritten by ``prepare_users`` (not intercepted again)."""
        self.calling: list[ModelCall] = []
        """Model calls waiting on the upstream now (a live run's status reads their start)."""

    @property
    def stopped(self) -> bool:
        return self.trace.stopped

    def release(self) -> None:
        """Seal the session: no later request is answered or committed."""
        self.released = True
        self.reservations.wake()

    # -- the model route --------------------------------------------------------------------

    async def chat(
        self,
        request: Request,
        params: dict[str, Any] | None = None,
        *,
        endpoint: str = "/chat/completions",
        dropped: dict[str, str] | None = None,
    ) -> Response:
        """Run one model request through the whole pipeline and commit the turn.

        ``params`` are the harness's other request fields (``max_tokens``, ``tool_choice``,
        ...) in Chat Completions' names: the allowed ones go upstream, under the rollout's
        sampling settings (``_core/upstream_fields``). ``endpoint`` is the route the harness
        spoke (recorded on the call), and ``dropped`` what of its request the proxy's dialect
        could not translate, with why (recorded beside the fields not forwarded).

        Raises:
            SessionConcluded: the session was released.
            TurnRefused: a limit or stop refused the turn, or a response stop fired after
                the turn was committed.
            RolloutError: a hook failed (``TaskError``) or the provider failed
                (``ProviderError``); both are stashed in ``error`` first.
        """
        self._check_open()
        async with self.reservations.admitted():
            await self.refused()
            request, stop_name = await self._guarded(self.rewrite_request(request))
            if stop_name is not None:
                self.graph.commit(request.messages, None)
                self._record_tools(request)
                self.trace.stop(stop_name)
                raise TurnRefused(stop_name)
            return await self._sample(request, params or {}, endpoint, dropped or {})

    async def _sample(
        self, request: Request, params: dict[str, Any], endpoint: str, untranslated: dict[str, str]
    ) -> Response:
        policy = self.policy
        if policy.paused:  # a weight update: wait before anything goes upstream
            await policy.wait()
            self._check_open()
        self.error = None
        sampling, dropped = upstream_fields(
            params, self.sampling, extra=self.model.forward_fields, tokens_left=self._tokens_left()
        )
        recorded = {k: v for k, v in sampling.items() if k in SAMPLING_FIELDS}
        dropped = {**untranslated, **dropped}
        call = ModelCall(
            model=self.model_name,
            sampling=recorded or None,
            endpoint=endpoint,
            time=TimeSpan(start=time.time()),
            policy=policy.version,  # the server's own stamp, if any, replaces it (record_tokens)
            dropped=dropped or None,
            tools_digest=self.token_prefix.digest(request.tools),
        )
        self.calling.append(call)
        try:
            response = await self._complete(request, sampling, call)
            call.usage, call.finish_reason = response.usage, response.finish_reason
            if self.released:
                raise SessionConcluded()
            response, records, stop_name = await self._guarded(self._rewrite_response(response))
            if self.trace.stopped:
                raise TurnRefused(self.trace.stop_condition or "stopped")
            call.node = self.graph.commit(request.messages, response.message)
            record_tokens(self.trace, call, response, rewritten=bool(records))
            self._record_tools(request)
            self._consume_prepared(request.messages)
            self.trace.response_rewrites.extend(records)
            if stop_name is not None:
                self.trace.stop(stop_name)
                raise TurnRefused(stop_name)
            return response
        except OverlongPromptError as e:
            call.error = ErrorRecord.from_exception(e)
            self.trace.stop("context_length")
            raise TurnRefused("context_length") from e
        except RolloutError as e:
            call.error = ErrorRecord.from_exception(e)
            self.error = e
            raise
        except Refusal:
            raise
        except BaseException as e:
            call.error = ErrorRecord.from_exception(e)  # a cancellation or a client bug: not stashed
            raise
        finally:
            call.time.end = time.time()
            self.calling.remove(call)
            if not self.released:
                self.trace.calls.append(call)

    async def _complete(self, request: Request, sampling: dict[str, Any], call: ModelCall) -> Response:
        token = SESSION_ID.set(self.trace.id)
        try:
            return await generate(
                self.model,
                request,
                name=self.model_name,
                sampling=sampling,
                policy=self.policy,
                call=call,
                prefix=self.token_prefix.prefix(request, call.tools_digest),
                check_open=self._check_open,
            )
        except (RolloutError, Refusal):
            raise
        except Exception as e:
            raise UpstreamError(f"model client failed: {type(e).__name__}: {e}") from e
        finally:
            SESSION_ID.reset(token)

    async def _guarded(self, awaitable: Awaitable[_T]) -> _T:
        """Await a hook phase, stashing its failure (hook errors answer 502, Q11)."""
        try:
            return await awaitable
        except RolloutError as e:
            self.error = e
            raise

    def _tokens_left(self) -> int | None:
        """Completion tokens the rollout's token caps still allow (``None``: no cap)."""
        limits = self.limits
        if limits.max_output_tokens is None and limits.max_total_tokens is None:
            return None
        counts = self.trace.counts()
        left = [
            cap - used
            for cap, used in (
                (limits.max_output_tokens, counts.num_output_tokens),
                (limits.max_total_tokens, counts.num_total_tokens),
            )
            if cap is not None
        ]
        return min(left)

    def _check_open(self) -> None:
        if self.released:
            raise SessionConcluded()
        if self.trace.stopped:
            raise TurnRefused(self.trace.stop_condition or "stopped")

    def _record_tools(self, request: Request) -> None:
        if request.tools:
            self.trace.tools = list(request.tools)

    # -- limits and stops -------------------------------------------------------------------

    async def refused(self) -> None:
        """Check limits, then trace ``@stop``s; on the first hit stop the trace and refuse.

        Raises:
            TurnRefused: a limit was reached or a stop fired (its name is the reason).
            TaskError: a trace stop returned a non-bool or raised (stashed).
        """
        reached = self.limits.reached(self.trace)
        if reached is not None:
            self.trace.stop(reached)
            raise TurnRefused(reached)
        for hook in self.trace_stops:
            try:
                result = await resolve(call_by_type(hook.fn, {Trace: self.trace}))
                if not isinstance(result, bool):
                    raise TaskError(f"@stop must return bool, got {type(result).__name__}")
            except RolloutError as e:
                self.error = e
                raise
            except Exception as e:
                self.error = TaskError(f"@stop {hook.name} failed: {type(e).__name__}: {e}")
                raise self.error from e
            if result:
                self.trace.stop(hook.name)
                raise TurnRefused(hook.name)
