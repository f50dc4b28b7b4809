"""Budgets no client can bypass (issue 10 §4): the limits under concurrent requests, one
sampling for an identical streamed retry, a rollout's share of the proxy's memory, and a
client that hangs up mid-stream."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import msgspec
import pytest
from test_proxy import post, proxy, run

from rollout_ray import Model, Request, Response, RolloutLimits, RolloutSession, Trace, TraceTask, Usage
from rollout_ray._record.messages import AssistantMessage
from rollout_ray.testing import ScriptedModel

pytestmark = pytest.mark.security


class GatedModel(Model):
    """Answers "4" once ``gate`` is set; counts the calls that reached it."""

    name = "gated"

    def __init__(self, completion_tokens: int = 1) -> None:
        self.gate = asyncio.Event()
        self.arrived = asyncio.Event()
        self.calls = 0
        self.completion_tokens = completion_tokens

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Response:
        self.calls += 1
        self.arrived.set()
        await self.gate.wait()
        return Response(AssistantMessage("4"), "stop", Usage(3, self.completion_tokens), model)


def _session(model: Model, **limits: int) -> RolloutSession:
    return RolloutSession(Trace(task=TraceTask(type="T")), model, limits=RolloutLimits(**limits))


def _body(i: int, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"question {i}"}], **extra}


async def _when(predicate: Any, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not within {timeout}s"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize(
    ("limits", "name", "admitted"),
    [
        ({"max_turns": 2}, "max_turns", 2),
        ({"max_output_tokens": 1}, "max_output_tokens", 1),
        ({"max_total_tokens": 5}, "max_total_tokens", 1),
    ],
)
def test_limits_hold_under_30_concurrent_requests(
    limits: dict[str, int], name: str, admitted: int, report: Any
) -> None:
    model = GatedModel(completion_tokens=5)
    session = _session(model, **limits)

    async def main() -> list[tuple[int, Any]]:
        async with proxy(session) as (_, (slot,), client):
            sent = [asyncio.create_task(post(client, slot, _body(i))) for i in range(30)]
            await _when(lambda: model.calls == admitted, f"{admitted} calls at the model")
            model.gate.set()
            return await asyncio.gather(*sent)

    t0 = time.monotonic()
    answers = run(main)
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200] * admitted + [400] * (30 - admitted)
    assert {body["error"]["message"] for status, body in answers if status == 400} == {f"rollout stopped: {name}"}
    assert model.calls == admitted and session.trace.num_turns == admitted
    assert session.trace.stop_condition == name
    report(
        f"10§4 {name} under concurrency",
        f"30 concurrent requests, {name}={limits[name]}",
        f"{admitted} turn(s) sampled, 28+ refused",
        "0 over the limit",
        time.monotonic() - t0,
    )


def test_an_identical_streamed_retry_joins_the_request_in_flight(report: Any) -> None:
    model = GatedModel()
    session = _session(model)
    body = _body(0, stream=True)

    async def main() -> tuple[bytes, bytes]:
        async with proxy(session) as (_, (slot,), client):
            first = asyncio.create_task(_stream(client, slot, body))
            await model.arrived.wait()
            retry = asyncio.create_task(_stream(client, slot, body, retry=1))
            await _when(
                lambda: len(_registration(session).inflight) == 1 and _registration(session).held.requests == 2,
                "the retry to reach the proxy",
            )
            model.gate.set()
            return await first, await retry

    t0 = time.monotonic()
    first, retry = run(main)
    assert model.calls == 1 and session.trace.num_turns == 1
    assert first == retry and first.endswith(b"data: [DONE]\n\n")
    report(
        "10§4 streamed SDK retry",
        "identical stream:true retry while in flight",
        "joined: 1 model call",
        "0 sampled twice",
        time.monotonic() - t0,
    )


_REGISTRATIONS: dict[int, Any] = {}


def _registration(session: RolloutSession) -> Any:
    return _REGISTRATIONS[id(session)]


async def _stream(client: aiohttp.ClientSession, slot: Any, body: dict[str, Any], retry: int = 0) -> bytes:
    headers = {"Authorization": f"Bearer {slot.model_secret}"}
    if retry:
        headers["x-stainless-retry-count"] = str(retry)
    async with client.post(
        f"{slot.base_url}/v1/chat/completions", data=msgspec.json.encode(body), headers=headers
    ) as resp:
        assert resp.status == 200
        return await resp.read()


@pytest.fixture(autouse=True)
def _see_registrations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the tests look at a session's registration (requests and bodies in flight)."""
    from rollout_ray._serving import proxy as proxy_module

    original = proxy_module._Registration.__init__

    def init(self: Any, session: RolloutSession, *args: Any, **kwargs: Any) -> None:
        original(self, session, *args, **kwargs)
        _REGISTRATIONS[id(session)] = self

    monkeypatch.setattr(proxy_module._Registration, "__init__", init)


async def _raw(
    port: int, secret: str, declared: int, sent: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
        ).encode()
        + sent
    )
    await writer.drain()
    return reader, writer


async def _status(reader: asyncio.StreamReader) -> int:
    line = await asyncio.wait_for(reader.readline(), 5)
    return int(line.split()[1])


def test_a_rollout_gets_its_share_of_the_proxy_not_more(report: Any) -> None:
    session = _session(ScriptedModel(default="4"))
    mib = 1 << 20

    async def main() -> tuple[int, int, int]:
        async with proxy(session) as (server, (slot,), _):
            reader, writer = await _raw(server.port, slot.model_secret, 60 * mib, b"{")
            huge = await _status(reader)  # answered without reading (or waiting for) the body
            writer.close()
            stalled = [await _raw(server.port, slot.model_secret, 15 * mib, b"{") for _ in range(2)]
            registration = _registration(session)
            await _when(lambda: registration.held.requests == 2, "two stalled bodies in flight")
            reader, writer = await _raw(server.port, slot.model_secret, 15 * mib, b"{")
            over = await _status(reader)
            high = registration.held.body_bytes
            for _, w in [*stalled, (reader, writer)]:
                w.close()
            return huge, over, high

    t0 = time.monotonic()
    huge, over, high = run(main)
    assert (huge, over) == (413, 429)
    assert high == 30 * mib  # the two stalled bodies; the third was refused before reading
    report(
        "10§4 proxy memory per rollout",
        "60 MiB body; 3 × 15 MiB stalled bodies",
        "413 unread; 429 over 32 MiB in flight",
        "0 bytes over the share",
        time.monotonic() - t0,
    )


def test_too_many_requests_of_one_rollout_in_flight_are_429() -> None:
    model = GatedModel()
    session = _session(model)

    async def main() -> list[int]:
        async with proxy(session, max_requests_per_rollout=2) as (_, (slot,), client):
            sent = [asyncio.create_task(post(client, slot, _body(i))) for i in range(2)]
            await _when(lambda: _registration(session).held.requests == 2, "two requests in flight")
            status, _ = await post(client, slot, _body(9))
            model.gate.set()
            return [status, *[s for s, _ in await asyncio.gather(*sent)]]

    assert run(main) == [429, 200, 200]


def test_a_client_that_hangs_up_mid_stream_logs_no_error(caplog: pytest.LogCaptureFixture, report: Any) -> None:
    caplog.set_level(logging.DEBUG)
    model = GatedModel()
    session = _session(model)

    async def main() -> None:
        async with proxy(session) as (server, (slot,), _):
            body = msgspec.json.encode(_body(0, stream=True))
            reader, writer = await _raw(server.port, slot.model_secret, len(body), body)
            await model.arrived.wait()
            writer.close()  # the client hangs up while its answer is being sampled
            await writer.wait_closed()
            model.gate.set()
            await _when(lambda: _registration(session).held.requests == 0, "the handler to finish")

    t0 = time.monotonic()
    run(main)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == [], [r.getMessage() for r in loud]
    assert session.trace.num_turns == 1  # the turn was sampled: it is on the trace
    report(
        "10§4 client hangs up mid-stream",
        "connection closed while sampling",
        "debug line only",
        "0 tracebacks",
        time.monotonic() - t0,
    )
