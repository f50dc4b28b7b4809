"""The gate's interrupt and the session's continuation loop, without a server (issue 22 §1):
which calls an interrupting pause waits for, and how a continued reply's tokens get versions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rollout_ray import ProviderError, Request, Response, UserMessage
from rollout_ray._core.generation import MAX_UNASKED_ABORTS, generate
from rollout_ray._core.model import CallContext, Interrupted, Model
from rollout_ray._core.policy_gate import PolicyGate
from rollout_ray._record.messages import AssistantMessage
from rollout_ray._record.trace import ModelCall

from conftest import run

ASK = Request([UserMessage("hi")])


def test_an_interrupting_pause_fires_the_calls_in_flight_and_waits_for_the_armed_ones() -> None:
    async def main() -> list[Any]:
        gate = PolicyGate()
        seen: list[Any] = []
        with gate.watch() as armed, gate.watch() as plain:
            armed.arm()
            gate.set(1, True, interrupt=True)
            seen.append((armed.fired, plain.fired))
            waiting = asyncio.ensure_future(gate.until_stopped())
            await asyncio.sleep(0)
            seen.append(waiting.done())  # the armed call has not stopped
        seen.append(await waiting)  # it stopped (left its watch); the plain one was never waited for
        return seen

    assert run(main()) == [(True, True), False, True]


def test_a_pause_without_interrupt_fires_nothing_and_a_call_after_it_is_not_fired() -> None:
    gate = PolicyGate()
    with gate.watch() as call:
        gate.set(1, True)
        gate.set(1, False, interrupt=True)  # a resume never interrupts
        assert not call.fired
    with gate.watch() as later:
        assert not later.fired


def test_calls_that_do_not_stop_are_given_up_on_after_the_timeout(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> bool:
        gate = PolicyGate()
        with gate.watch() as call:
            call.arm()
            gate.set(1, True, interrupt=True)
            return await gate.until_stopped(timeout=5.0)

    assert run(main()) is False
    assert "interrupt: 1 model calls did not stop within 5s" in caplog.text


class Stopping(Model):
    """Stops after ``every`` tokens each time it is asked, ``times`` times, then finishes; its
    tokens carry no version (the gate's are recorded). ``fire``: interrupt itself (our pause)
    or not (the server aborted alone)."""

    def __init__(self, times: int, fire: bool, gate: PolicyGate, every: int = 2) -> None:
        self.times, self.fire, self.gate, self.every = times, fire, gate, every

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Response:
        raise AssertionError("generate is the entry point")

    async def generate(
        self, request: Request, *, model: str | None, sampling: dict[str, Any], call: CallContext
    ) -> Response:
        return await self._segment(call, 0)

    async def resume(
        self,
        request: Request,
        interrupted: Interrupted,
        *,
        model: str | None,
        sampling: dict[str, Any],
        call: CallContext,
    ) -> Response:
        return await self._segment(call, interrupted.state)

    async def _segment(self, call: CallContext, done: int) -> Response:
        assert call.interrupt is not None
        if self.times:
            self.times -= 1
            if self.fire:
                self.gate.set(self.gate.version, True, interrupt=True)
                asyncio.get_running_loop().call_soon(self.gate.set, (self.gate.version or 0) + 1, False)
            raise Interrupted(done + self.every, done + self.every)
        ids = list(range(done + self.every))
        return Response(AssistantMessage("ok"), token_ids=ids, token_logprobs=[-1.0] * len(ids))


def continued(model: Stopping, gate: PolicyGate) -> tuple[Response, ModelCall]:
    call = ModelCall(policy=gate.version)

    async def main() -> Response:
        return await generate(
            model, ASK, name=None, sampling={}, policy=gate, call=call, prefix=(None, 0), check_open=lambda: None
        )

    return run(main()), call


def test_each_segment_of_a_continued_reply_has_the_version_it_was_sent_under() -> None:
    gate = PolicyGate()
    gate.set(5, False)
    response, call = continued(Stopping(times=2, fire=True, gate=gate), gate)
    assert call.interrupts == 2 and response.token_ids == list(range(6))
    assert response.token_versions == [5, 5, 6, 6, 7, 7]


def test_a_server_that_keeps_aborting_on_its_own_fails_the_call() -> None:
    gate = PolicyGate()
    with pytest.raises(ProviderError, match=f"^the model server aborted the call {MAX_UNASKED_ABORTS} times in a row$"):
        continued(Stopping(times=MAX_UNASKED_ABORTS, fire=False, gate=gate), gate)
    response, call = continued(Stopping(times=MAX_UNASKED_ABORTS - 1, fire=False, gate=gate), gate)
    assert call.interrupts == MAX_UNASKED_ABORTS - 1 and response.token_versions == [None] * (2 * MAX_UNASKED_ABORTS)
