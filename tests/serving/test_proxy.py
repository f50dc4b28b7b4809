"""The HTTP interception proxy: auth, errors, retries, streaming, isolation (§5.1, §5.2)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import msgspec

from rollout_ray import ProviderError, Request, RolloutLimits, RolloutSession, Trace, TraceTask
from rollout_ray._core.hooks import Hook
from rollout_ray._record.openai_stream import StreamAssembler
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray.testing import Reply, ScriptedModel

BODY = {"model": "whatever", "messages": [{"role": "user", "content": "2+2?"}]}


def new_session(model: ScriptedModel | None = None, **kwargs: Any) -> RolloutSession:
    return RolloutSession(Trace(task=TraceTask(type="T")), model or ScriptedModel(default="4"), **kwargs)


@asynccontextmanager
async def proxy(
    *sessions: RolloutSession, **kwargs: Any
) -> AsyncIterator[tuple[HTTPInterception, list[Any], aiohttp.ClientSession]]:
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(HTTPInterception(**kwargs))
        slots = [await stack.enter_async_context(server.serve(s)) for s in sessions]
        client = await stack.enter_async_context(aiohttp.ClientSession())
        yield server, slots, client


async def post(
    client: aiohttp.ClientSession,
    slot: Any,
    body: Any = BODY,
    *,
    secret: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    auth = {"Authorization": f"Bearer {secret if secret is not None else slot.model_secret}"}
    async with client.post(
        f"{slot.base_url}/v1/chat/completions", data=data, headers={**auth, **(headers or {})}
    ) as resp:
        raw = await resp.read()
        try:
            return resp.status, msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return resp.status, raw


def arrive(event: asyncio.Event, reply: Reply) -> Callable[[Request], Reply]:
    """A script item that signals when the request reaches the model."""

    def item(request: Request) -> Reply:
        event.set()
        return reply

    return item


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(fn())


def test_completion_is_committed_and_returned_in_openai_shape() -> None:
    session = new_session(ScriptedModel([Reply("4")]), model_name="sim")

    async def main() -> None:
        async with proxy(session) as (server, (slot,), client):
            status, body = await post(client, slot)
            assert status == 200
            assert body["choices"][0]["message"] == {"role": "assistant", "content": "4"}
            assert body["model"] == "sim" and body["usage"]["total_tokens"] == 2
            assert server.base_url.startswith("http://127.0.0.1:")

    run(main)
    assert session.trace.num_turns == 1 and session.trace.calls[0].node == 1


def test_401_for_unknown_missing_and_state_secrets() -> None:
    async def main() -> None:
        async with proxy(new_session()) as (_, (slot,), client):
            for secret in ("", "wrong", slot.state_secret):
                status, body = await post(client, slot, secret=secret)
                assert status == 401 and body["error"]["message"] == "unknown or missing rollout secret"

    run(main)


def test_400_names_the_bad_field() -> None:
    async def main() -> None:
        async with proxy(new_session()) as (_, (slot,), client):
            status, body = await post(client, slot, b"{not json")
            assert status == 400 and body["error"]["message"].startswith("body is not valid JSON")
            status, body = await post(client, slot, {"messages": [{"role": "user", "content": 3}]})
            assert status == 400 and body["error"]["param"] == "messages[0].content"
            status, body = await post(client, slot, {"messages": [{"role": "tool", "content": "x"}]})
            assert (status, body["error"]["param"]) == (400, "messages[0].tool_call_id")
            status, body = await post(client, slot, {"model": "m"})
            assert status == 400 and "messages" in body["error"]["message"]
            # Recorded params must fit the trace's msgpack (found by the security suite).
            huge = {"messages": [{"role": "user", "content": "hi"}], "seed": 2**70, "extra_body": {"n": [1, -(2**64)]}}
            status, body = await post(client, slot, huge)
            assert (status, body["error"]["param"]) == (400, "seed")
            del huge["seed"]
            status, body = await post(client, slot, huge)
            assert (status, body["error"]["param"]) == (400, "extra_body.n[1]")

    run(main)


def test_413_for_a_body_over_the_cap() -> None:
    session = new_session()

    async def main() -> None:
        async with proxy(session, max_body=1024) as (_, (slot,), client):
            big = {"messages": [{"role": "user", "content": "x" * 5000}]}
            status, _ = await post(client, slot, big)
            assert status == 413

    run(main)
    assert session.trace.nodes == []


def test_refused_turn_is_400_rollout_stopped() -> None:
    session = new_session(limits=RolloutLimits(max_turns=1))

    async def main() -> None:
        async with proxy(session) as (_, (slot,), client):
            assert (await post(client, slot))[0] == 200
            status, body = await post(client, slot, {"messages": [{"role": "user", "content": "again"}]})
            assert (status, body["error"]["message"]) == (400, "rollout stopped: max_turns")

    run(main)
    assert session.trace.stop_condition == "max_turns"


def test_provider_errors_are_relayed_with_their_status_and_stashed() -> None:
    session = new_session(ScriptedModel([ProviderError("slow down", 429), ProviderError("boom", 503)]))

    async def main() -> None:
        async with proxy(session) as (_, (slot,), client):
            assert (await post(client, slot))[0] == 429
            status, body = await post(client, slot, {"messages": [{"role": "user", "content": "b"}]})
            assert (status, body["error"]["message"]) == (503, "boom")

    run(main)
    assert isinstance(session.error, ProviderError) and session.error.status_code == 503


def test_hook_failure_is_502() -> None:
    def sloppy(trace: Trace) -> Any:
        return None

    async def main() -> None:
        async with proxy(new_session(trace_stops=[Hook("sloppy", sloppy)])) as (_, (slot,), client):
            status, body = await post(client, slot)
            assert (status, body["error"]["message"]) == (502, "@stop must return bool, got NoneType")

    run(main)


def test_sdk_retry_of_an_answered_request_is_replayed_not_resampled() -> None:
    model = ScriptedModel(["first", "second"])
    session = new_session(model)

    async def main() -> None:
        async with proxy(session) as (_, (slot,), client):
            _, a = await post(client, slot)
            _, b = await post(client, slot, headers={"x-stainless-retry-count": "1"})
            assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"] == "first"

    run(main)
    assert len(model.requests) == 1 and session.trace.num_turns == 1


def test_sdk_retry_of_an_inflight_request_joins_it() -> None:
    reached = asyncio.Event()
    model = ScriptedModel([arrive(reached, Reply("slow", delay=0.2)), "second"])
    session = new_session(model)

    async def main() -> None:
        async with proxy(session) as (_, (slot,), client):
            first = asyncio.create_task(post(client, slot))
            await reached.wait()  # the first attempt reached the model
            retry = await post(client, slot, headers={"x-stainless-retry-count": "1"})
            original = (await first)[1]
            assert (original["id"], original["choices"]) == (retry[1]["id"], retry[1]["choices"])

    run(main)
    assert len(model.requests) == 1 and session.trace.num_turns == 1


def test_sealed_session_never_gets_a_late_turn() -> None:
    reached = asyncio.Event()
    model = ScriptedModel([arrive(reached, Reply("late", delay=30))])
    session = new_session(model)

    async def main() -> None:
        server = HTTPInterception()
        await server.start()
        async with aiohttp.ClientSession() as client:
            async with server.serve(session) as slot:
                pending = asyncio.create_task(post(client, slot))
                await reached.wait()
            # Unregistered: the in-flight handler was cancelled, the secret is unknown now.
            assert (await post(client, slot))[0] == 401
            pending.cancel()
        await server.stop()

    run(main)
    assert session.released and session.trace.nodes == [] and session.trace.calls == []


def test_one_rollout_cannot_reach_another_rollouts_session() -> None:
    a, b = new_session(ScriptedModel(default="A")), new_session(ScriptedModel(default="B"))

    async def main() -> None:
        async with proxy(a, b) as (_, (slot_a, slot_b), client):
            _, body = await post(client, slot_a)
            assert body["choices"][0]["message"]["content"] == "A"
            _, body = await post(client, slot_b)
            assert body["choices"][0]["message"]["content"] == "B"

    run(main)
    assert (a.trace.num_turns, b.trace.num_turns) == (1, 1)


def test_streaming_answer_assembles_to_the_committed_turn() -> None:
    session = new_session(ScriptedModel([Reply(tool_calls=[("add", {"a": 1, "b": 2})])]))

    async def main() -> None:
        async with proxy(session) as (_, (slot,), client):
            body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
            async with client.post(
                f"{slot.base_url}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {slot.model_secret}"},
            ) as resp:
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                assembler = StreamAssembler()
                async for line in resp.content:
                    if line.startswith(b"data:"):
                        assembler.feed(line[5:].strip())
            return assembler.response()

    response = run(main)
    committed = session.trace.nodes[-1].message
    assert response.message == committed and response.finish_reason == "tool_calls"
    assert response.usage == session.trace.calls[0].usage


def test_models_route_and_state_secret_task_route() -> None:
    session = new_session(model_name="sim")

    async def main() -> None:
        async with proxy(session) as (_, (slot,), client):
            async with client.get(
                f"{slot.base_url}/v1/models", headers={"Authorization": f"Bearer {slot.model_secret}"}
            ) as resp:
                assert (await resp.json())["data"][0]["id"] == "sim"
            async with client.get(
                f"{slot.base_url}/task", headers={"Authorization": f"Bearer {slot.model_secret}"}
            ) as resp:
                assert resp.status == 401
            async with client.get(
                f"{slot.base_url}/task", headers={"Authorization": f"Bearer {slot.state_secret}"}
            ) as resp:
                assert await resp.json() == {"cls": None, "task": "{}"}  # upstream's shape (test_task_route.py)

    run(main)


def test_harness_sampling_params_pass_through_and_rollout_sampling_wins() -> None:
    seen: list[dict[str, Any]] = []

    class Spy(ScriptedModel):
        async def complete(self, request: Request, *, model: Any, sampling: Any) -> Any:
            seen.append(sampling)
            return await super().complete(request, model=model, sampling=sampling)

    session = new_session(Spy(default="4"), sampling={"temperature": 0.0})

    async def main() -> None:
        async with proxy(session) as (_, (slot,), client):
            await post(client, slot, {**BODY, "temperature": 1.5, "max_tokens": 7})

    run(main)
    assert seen == [{"temperature": 0.0, "max_tokens": 7}]


def test_a_model_client_bug_is_502_not_500() -> None:
    session = new_session(ScriptedModel([ConnectionResetError("peer reset")]))

    async def main() -> None:
        async with proxy(session) as (_, (slot,), client):
            status, body = await post(client, slot)
            assert (status, body["error"]["message"]) == (502, "model client failed: ConnectionResetError: peer reset")

    run(main)
    assert session.error is None and session.trace.calls[0].error is not None


def test_tool_choice_object_shape_is_dropped_and_recorded_and_a_malformed_one_is_400() -> None:
    """Real agents send ``{"type": "function", "function": {"name": ...}}``: it was a 500 (the
    allow-list check hashed it); a forced call is dropped and recorded, a malformed one is a 400."""
    session = new_session(ScriptedModel(default="4"))
    forced = {"type": "function", "function": {"name": "f"}}

    async def main() -> None:
        async with proxy(session) as (_, (slot,), client):
            status, body = await post(client, slot, {**BODY, "tool_choice": forced})
            assert status == 200, body
            for bad in ({}, [], {"type": "function"}, "sometimes", 3):
                status, body = await post(client, slot, {**BODY, "tool_choice": bad})
                assert (status, body["error"]["param"]) == (400, "tool_choice"), bad

    run(main)
    (call,) = session.trace.calls
    assert call.dropped == {"tool_choice": "not forwarded: a forced tool call is constrained decoding"}
    assert call.endpoint == "/chat/completions"


def test_a_stopped_or_concluded_rollout_gets_no_body_parsed_but_its_last_answer_replayed() -> None:
    """Security review F4: the dialect parse ran before the stopped/released checks (and
    count_tokens parsed for any session), so a spent rollout could still stall the node's
    loop with 15 MiB bodies. A body that does not parse shows which check came first."""
    session = new_session()
    unparsable = b'{"messages": [' + b"{}," * 1000  # truncated JSON: parsing it is a 400 of its own

    async def main() -> None:
        async with proxy(session) as (_, (slot,), client):
            status, first = await post(client, slot)
            session.trace.stop("max_turns")  # its budget spent: every model call is refused
            assert status == 200 and session.stopped
            status, body = await post(client, slot, unparsable)
            assert (status, body["error"]["message"]) == (400, "rollout stopped: max_turns")
            status, again = await post(client, slot, headers={"x-stainless-retry-count": "1"})
            assert status == 200 and again["id"] == first["id"]  # the SDK retry of the last answer still replays
            status, body = await post(client, slot, unparsable, headers={"x-stainless-retry-count": "1"})
            assert (status, body["error"]["message"]) == (400, "rollout stopped: max_turns")
            count = f"{slot.base_url}/v1/messages/count_tokens"
            async with client.post(count, data=b'{"messages": []}', headers={"x-api-key": slot.model_secret}) as r:
                assert r.status == 400 and "rollout stopped" in (await r.json())["error"]["message"]
            session.release()
            status, body = await post(client, slot, unparsable)
            assert (status, body["error"]["message"]) == (409, "rollout concluded")

    run(main)
