"""Interruptible generation on the simulated model (issue 22 §1): a pause that interrupts stops
the calls in flight at their server, keeps what they sampled, and continues them after the
resume from their partial output under the new version; each token records its version."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from interrupt_rig import QUESTION, interrupt, served, session

from rollout_ray import Request, UserMessage
from rollout_ray._record.arrow import RolloutRecord, records_to_table
from rollout_ray._record.tokens import token_sequences


async def reference(stream: bool) -> Any:
    async with served(stream) as (_, model):
        s = session(model)
        response = await asyncio.wait_for(s.chat(QUESTION), 30)
        return response, s.trace.calls[0]


async def interrupted(stream: bool, to: int | None, at: int = 50) -> Any:
    async with served(stream) as (server, model):
        s = session(model)
        call = asyncio.ensure_future(s.chat(QUESTION))
        stopped = await interrupt(server, s.policy, at=at, to=to)
        response = await asyncio.wait_for(call, 30)
        return response, s.trace, stopped


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_interrupted_call_continued_under_the_same_version_is_the_uninterrupted_one(stream: bool) -> None:
    (whole, plain), (again, trace, stopped) = asyncio.run(reference(stream)), asyncio.run(interrupted(stream, None))
    (call,) = trace.calls
    assert stopped and call.interrupts == 1 and plain.interrupts == 0
    assert again.token_ids == whole.token_ids and again.token_logprobs == whole.token_logprobs
    assert again.message == whole.message and again.finish_reason == whole.finish_reason == "stop"
    assert (call.policy, call.token_policy) == (3, None)  # every token of version 3


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_update_mid_call_keeps_what_was_sampled_and_continues_under_the_new_version(stream: bool) -> None:
    (whole, _), (reply, trace, stopped) = asyncio.run(reference(stream)), asyncio.run(interrupted(stream, 4))
    (call,) = trace.calls
    assert stopped and call.interrupts == 1 and call.error is None
    (old, kept), (new, rest) = call.token_policy
    assert (old, new) == (3, 4) and kept >= 50 and rest > 0 and kept + rest == len(reply.token_ids)
    assert reply.token_ids[:kept] == whole.token_ids[:kept]  # nothing sampled was thrown away
    assert reply.token_logprobs[:kept] == whole.token_logprobs[:kept]
    assert reply.token_ids[kept:] != whole.token_ids[kept : len(reply.token_ids)]  # version 4 wrote the rest
    assert reply.message.content.endswith("5") and reply.finish_reason == "stop"  # one whole reply
    assert trace.nodes[call.node].token_ids == reply.token_ids
    [sequence] = token_sequences(trace)
    sampled = [v for v, m in zip(sequence.policy, sequence.loss_mask) if m]
    assert sampled == [3] * kept + [4] * rest
    assert set(v for v, m in zip(sequence.policy, sequence.loss_mask) if not m) == {None}
    row = records_to_table([RolloutRecord(trace, "run", "g", 0)]).to_pylist()[0]
    assert row["token_policy"] == [sequence.policy] and (row["policy_min"], row["policy_max"]) == (3, 4)


def test_the_harness_sees_one_reply_through_the_proxy() -> None:
    from rollout_ray._serving.proxy import HTTPInterception

    async def main() -> tuple[dict[str, Any], Any]:
        async with served(stream=True) as (server, model), HTTPInterception() as proxy:
            s = session(model)
            async with proxy.serve(s) as slot, __import__("aiohttp").ClientSession() as http:
                body = {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}
                headers = {"Authorization": f"Bearer {slot.model_secret}"}
                answer = asyncio.ensure_future(
                    http.post(f"{slot.base_url}/v1/chat/completions", json=body, headers=headers)
                )
                await interrupt(server, s.policy, at=40, to=4)
                async with await answer as resp:
                    return await resp.json(), s.trace

    body, trace = asyncio.run(main())
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"].endswith("5")
    assert (
        trace.calls[0].interrupts == 1
        and trace.nodes[trace.calls[0].node].message.content == choice["message"]["content"]
    )


def test_a_pause_that_does_not_interrupt_lets_the_call_finish() -> None:
    async def main() -> Any:
        async with served() as (server, model):
            s = session(model)
            call = asyncio.ensure_future(s.chat(QUESTION))
            from interrupt_rig import freeze_after

            await freeze_after(server, 30)
            s.policy.set(3, True)  # interrupt=False
            assert await s.policy.until_stopped(timeout=1) is True  # nothing to stop
            server.engine.resume()
            response = await asyncio.wait_for(call, 30)
            s.policy.set(4, False)
            return response, s.trace.calls[0]

    response, call = asyncio.run(main())
    assert call.interrupts == 0 and call.token_policy is None and call.policy == 3 and len(response.token_ids) == 202


def test_a_server_without_token_in_finishes_its_call_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rollout_ray")

    async def main() -> Any:
        async with served(scale_out=False) as (server, model):  # vLLM without --enable-scale-out
            s = session(model)
            calls = [asyncio.ensure_future(s.chat(Request([UserMessage(f"What is {n} + 3?")]))) for n in (2, 4)]
            stopped = await interrupt(server, s.policy, at=30, to=None)
            return stopped, await asyncio.wait_for(asyncio.gather(*calls), 30), s.trace.calls

    stopped, responses, calls = asyncio.run(main())
    assert stopped and [c.interrupts for c in calls] == [0, 0]
    assert [c.policy for c in calls] == [3, 3] and all(len(r.token_ids) == 202 for r in responses)
    lines = [r.getMessage() for r in caplog.records if "cannot be interrupted" in r.getMessage()]
    assert lines == [
        "interrupt: 2 model calls in flight cannot be interrupted (their model client has no token-in "
        "route to continue them: a plain OpenAI-compatible server, or token capture off); they run to "
        "their end, as with interrupt=False"
    ]


def test_a_call_its_server_aborted_alone_is_continued_at_once() -> None:
    async def main() -> Any:
        async with served() as (server, model):
            s = session(model)
            call = asyncio.ensure_future(s.chat(QUESTION))
            from interrupt_rig import freeze_after

            await freeze_after(server, 20)
            server.engine.abort()  # someone else's /pause?mode=abort, say
            server.engine.resume()
            return await asyncio.wait_for(call, 30), s.trace.calls[0]

    (whole, _), (response, call) = asyncio.run(reference(False)), asyncio.run(main())
    assert call.interrupts == 1 and response.token_ids == whole.token_ids


def test_an_interrupt_before_the_generation_is_sent_continues_from_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """The pause lands while the call is still rendering its prompt: nothing was sampled, the
    whole reply is the new version's, and the log does not say it could not be interrupted."""
    caplog.set_level(logging.WARNING, logger="rollout_ray")

    async def main() -> Any:
        async with served() as (server, model):
            s = session(model)
            await server.engine.pause("keep")  # the generation will be held, not the render
            call = asyncio.ensure_future(s.chat(QUESTION))
            async with asyncio.timeout(30):
                while not s.policy._calls:  # the call passed the gate
                    await asyncio.sleep(0.001)
            s.policy.set(3, True, interrupt=True)
            assert await s.policy.until_stopped()
            server.engine.resume()
            server.policy_version = 4
            s.policy.set(4, False)
            return await asyncio.wait_for(call, 30), s.trace.calls[0]

    response, call = asyncio.run(main())
    assert call.interrupts == 1 and call.policy == 4 and call.token_policy is None and response.token_ids
    assert not [r for r in caplog.records if "cannot be interrupted" in r.getMessage()]
