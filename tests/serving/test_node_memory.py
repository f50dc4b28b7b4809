"""A node's services hold a bounded amount of memory, whatever the rollouts send (issue 21 §3).

A rollout's tool calls get its share of the tool server, as its model calls get their share of
the proxy; the rollouts of a node together get the node's ``BodyBudget``; what the trace
records of a tool call or a message is cut at a cap, keeping its original size, and a cut
message still matches the next request and leaves the token record whole.

The figures (memory at its peak, bytes held) are Python's allocations while the test runs
(``tracemalloc``): the bodies, their parsed copies and what the trace keeps. The "was" figures
are the same scenarios measured the same way on the code before these bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from typing import Any

import msgspec
import pytest
from capture_rig import rig, run

from rollout_ray import Model, Request, Response, RolloutSession, Trace, TraceTask, Usage
from rollout_ray._core.toolset import Toolset, tool
from rollout_ray._record.capped import MAX_MESSAGE_CHARS, MAX_TOOL_CALL_CHARS, marker
from rollout_ray._record.messages import AssistantMessage, text_of
from rollout_ray._record.tokens import token_sequences
from rollout_ray._serving.http_service import DEFAULT_MAX_BODY_BYTES_IN_FLIGHT, BodyBudget
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray._serving.tool_server import DEFAULT_MAX_CALL_BYTES_PER_ROLLOUT, ToolServer
from rollout_ray._simulated.config import SimulatedModelConfig

pytestmark = pytest.mark.security

MIB = 1 << 20
CHUNK = 64 << 10
"""Bytes a client writes at a time: its own buffers stay small beside the server's."""


@contextlib.contextmanager
def traced() -> Iterator[dict[str, float]]:
    """Python's allocations over the block: ``peak`` and ``held`` (at its end) in MiB, each
    over what was allocated when it began."""
    gc.collect()
    tracemalloc.start()
    figures: dict[str, float] = {}
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield figures
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
        figures.update(peak=(peak - base) / MIB, held=(current - base) / MIB)
    finally:
        tracemalloc.stop()


async def exchange(port: int, head: str, body: bytes) -> int:
    """Send one request on its own connection; its status, read while the body is still going
    out (a refused one is answered before its body is read)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sending = asyncio.ensure_future(_send(writer, head.encode(), body))
    try:
        line = await reader.readline()
        return int(line.split()[1])
    finally:
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sending
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _send(writer: asyncio.StreamWriter, head: bytes, body: bytes) -> None:
    writer.write(head)
    view = memoryview(body)
    for at in range(0, len(body), CHUNK):
        writer.write(view[at : at + CHUNK])
        await writer.drain()


def _head(path: str, length: int, secret: str | None = None) -> str:
    auth = f"Authorization: Bearer {secret}\r\n" if secret else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )


def _padded(prefix: bytes, suffix: bytes, size: int) -> bytes:
    """A JSON body of exactly ``size`` bytes: a string of x between ``prefix`` and ``suffix``."""
    return prefix + b"x" * (size - len(prefix) - len(suffix)) + suffix


async def _until(predicate: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not within {timeout}s"
        await asyncio.sleep(0.01)


# -- a rollout's tool calls -----------------------------------------------------------------


class Keeper(Toolset):
    name = "keeper"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.running = 0

    @tool
    async def keep(self, blob: str) -> int:
        """Hold ``blob`` until the gate opens; answer its length."""
        self.running += 1
        await self.gate.wait()
        return len(blob)


def test_one_rollouts_tool_calls_get_its_share_of_the_tool_server(report: Any) -> None:
    """40 concurrent 15 MiB tool calls of one rollout: before, all were answered, the node's
    services grew by ~1 GiB and kept 600 MiB of arguments."""
    keeper, trace = Keeper(), Trace(task=TraceTask(type="T"))
    body = _padded(b'{"name": "keep", "arguments": {"blob": "', b'"}}', 15 * MIB)

    async def main() -> list[int]:
        async with ToolServer() as server, server.serve([keeper], None, on_call=trace.tool_calls.append) as urls:
            path = urls["keeper"].split(str(server.port), 1)[1] + "/call"
            calls = [asyncio.ensure_future(exchange(server.port, _head(path, len(body)), body)) for _ in range(40)]
            await _until(lambda: sum(c.done() for c in calls) == 38 and keeper.running == 2, "38 refused, 2 running")
            keeper.gate.set()
            return await asyncio.gather(*calls)

    t0 = time.monotonic()
    with traced() as memory:
        statuses = run(main)
    seconds = time.monotonic() - t0
    assert sorted(statuses) == [200] * 2 + [429] * 38  # 2 × 15 MiB fit the rollout's 32 MiB
    kept = sum(len(c.arguments) for c in trace.tool_calls)
    arguments = len(msgspec.json.encode(msgspec.json.decode(body)["arguments"]))
    assert [(c.ok, c.arguments_chars) for c in trace.tool_calls] == [(True, arguments)] * 2
    assert all(c.arguments.endswith(marker(arguments)) for c in trace.tool_calls)
    assert kept <= 2 * (MAX_TOOL_CALL_CHARS + 64)
    assert memory["peak"] < 6 * DEFAULT_MAX_CALL_BYTES_PER_ROLLOUT / MIB, memory
    report(
        "21§3 one rollout's tool calls",
        "40 concurrent 15 MiB tool calls",
        f"2 run, 38 × 429 unread; peak +{memory['peak']:.0f} MiB (was: 40 run, +2,100 MiB)",
        f"{kept / 1024:.0f} KiB of arguments kept (was 600 MiB)",
        seconds,
    )


# -- the rollouts of a node, together ---------------------------------------------------------


class Gated(Model):
    """Answers "4" once ``gate`` is set."""

    name = "gated"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.calls = 0

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Response:
        self.calls += 1
        await self.gate.wait()
        return Response(AssistantMessage("4"), "stop", Usage(3, 1), model)


@contextlib.asynccontextmanager
async def node(model: Model, rollouts: int) -> AsyncIterator[tuple[HTTPInterception, list[Any], BodyBudget]]:
    """A proxy and a tool server sharing one ``BodyBudget``, as a node's services do, and
    ``rollouts`` sessions registered at the proxy."""
    budget = BodyBudget()
    async with AsyncExitStack() as stack:
        proxy = await stack.enter_async_context(HTTPInterception(body_budget=budget))
        await stack.enter_async_context(ToolServer(body_budget=budget))
        slots = [
            await stack.enter_async_context(proxy.serve(RolloutSession(Trace(task=TraceTask(type="T")), model)))
            for _ in range(rollouts)
        ]
        yield proxy, slots, budget


def test_the_rollouts_of_a_node_together_get_the_nodes_budget(report: Any) -> None:
    """20 rollouts × 2 concurrent 15 MiB model calls: each within its rollout's share, together
    they peaked at +1.8 GiB."""
    model = Gated()
    body = _padded(b'{"messages": [{"role": "user", "content": "', b'"}]}', 15 * MIB)

    async def main() -> tuple[list[int], int]:
        async with node(model, 20) as (proxy, slots, budget):
            head = [_head("/v1/chat/completions", len(body), slot.model_secret) for slot in slots]
            calls = [asyncio.ensure_future(exchange(proxy.port, h, body)) for h in head for _ in range(2)]
            admitted = DEFAULT_MAX_BODY_BYTES_IN_FLIGHT // len(body)
            await _until(
                lambda: sum(c.done() for c in calls) == 40 - admitted and model.calls == admitted,
                f"{admitted} calls at the model, the rest refused",
            )
            model.gate.set()
            return await asyncio.gather(*calls), budget.peak

    t0 = time.monotonic()
    with traced() as memory:
        statuses, reserved = run(main)
    seconds = time.monotonic() - t0
    admitted = DEFAULT_MAX_BODY_BYTES_IN_FLIGHT // len(body)
    assert sorted(statuses) == [200] * admitted + [503] * (40 - admitted)
    assert reserved == admitted * len(body) <= DEFAULT_MAX_BODY_BYTES_IN_FLIGHT
    assert memory["peak"] < 6 * DEFAULT_MAX_BODY_BYTES_IN_FLIGHT / MIB, memory
    report(
        "21§3 a node's model calls",
        "20 rollouts × 2 concurrent 15 MiB calls",
        f"{admitted} at a time, {40 - admitted} × 503 unread; peak +{memory['peak']:.0f} MiB (was +1,238 MiB)",
        f"{reserved / MIB:.0f} MiB of bodies in flight at most",
        seconds,
    )


def test_503_names_the_node_and_says_when_to_retry() -> None:
    model = Gated()
    body = _padded(b'{"messages": [{"role": "user", "content": "', b'"}]}', 15 * MIB)

    async def main() -> tuple[int, dict[str, str], bytes]:
        async with node(model, 3) as (proxy, slots, _):
            full = [
                asyncio.ensure_future(
                    exchange(proxy.port, _head("/v1/chat/completions", len(body), s.model_secret), body)
                )
                for s in slots[:2]
                for _ in range(2)
            ]
            await _until(lambda: model.calls == 4, "4 bodies in flight")
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(_head("/v1/chat/completions", len(body), slots[2].model_secret).encode())
            answer = await reader.read()  # refused before a byte of the body is sent; closed after
            writer.close()
            model.gate.set()
            await asyncio.gather(*full)
            status, *lines = answer.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
            headers = dict(line.split(": ", 1) for line in lines)
            return int(status.split()[1]), headers, answer.split(b"\r\n\r\n", 1)[1]

    status, headers, payload = run(main)
    assert status == 503 and headers["Retry-After"] == "1"
    assert msgspec.json.decode(payload)["error"]["message"] == (
        f"the node holds {DEFAULT_MAX_BODY_BYTES_IN_FLIGHT} body bytes in flight; retry shortly"
    )


# -- what the trace keeps of a message -------------------------------------------------------


def test_recorded_turns_keep_at_most_the_cap_of_each_message(report: Any) -> None:
    """12 sequential turns, each an 8 MiB message: before, the proxy held +98 MiB for the
    session."""
    model = Gated()  # unlike ScriptedModel, it keeps no request
    model.gate.set()
    session = RolloutSession(Trace(task=TraceTask(type="T")), model)
    size = 8 * MIB

    async def main() -> list[int]:
        async with HTTPInterception() as proxy, proxy.serve(session) as slot:
            statuses = []
            for turn in range(12):
                body = _padded(b'{"messages": [{"role": "user", "content": "' + bytes([65 + turn]), b'"}]}', size)
                statuses.append(
                    await exchange(proxy.port, _head("/v1/chat/completions", len(body), slot.model_secret), body)
                )
            return statuses

    t0 = time.monotonic()
    with traced() as memory:
        statuses = run(main)
        held = len(msgspec.msgpack.encode(session.trace))
    seconds = time.monotonic() - t0
    assert statuses == [200] * 12
    users = [n for n in session.trace.nodes if not n.sampled]
    length = size - len(b'{"messages": [{"role": "user", "content": ""}]}')
    assert [n.original_chars for n in users] == [length] * 12
    assert all(text_of(n.message.content).endswith(marker(length)) for n in users)
    assert held < 12 * (MAX_MESSAGE_CHARS + 1024)
    assert memory["held"] < 2 * held / MIB + 8, memory  # the trace, and nothing else of the bodies
    report(
        "21§3 recorded turns",
        "12 sequential 8 MiB turns of one session",
        f"each message cut at {MAX_MESSAGE_CHARS >> 20} MiB, its length kept",
        f"+{memory['held']:.0f} MiB held (was +96 MiB)",
        seconds,
    )


def test_a_cut_message_still_matches_the_next_turn_and_the_token_record_is_whole() -> None:
    """The cap cuts text only: the next request, which carries the message whole, continues
    the same branch, and the token ids (which the server gave) are those of an uncut trace."""
    long = "tell me a long story " * 20

    async def main() -> tuple[Trace, Trace]:
        async with rig(SimulatedModelConfig(ttft=0), token_capture="vllm") as r:
            traces = []
            for cap in (40, MAX_MESSAGE_CHARS):
                session, slot = await r.open_session()
                session.graph.max_message_chars = cap
                messages: list[Any] = [{"role": "user", "content": long}]
                for follow_up in ("and then?", "the end?"):
                    status, body = await r.post(slot, {"messages": messages})
                    assert status == 200, body
                    messages += [body["choices"][0]["message"], {"role": "user", "content": follow_up}]
                traces.append(session.trace)
            return traces[0], traces[1]

    cut, whole = run(main)
    assert len(cut.branches) == len(whole.branches) == 1 and cut.num_turns == whole.num_turns == 2
    first = cut.nodes[0]
    assert first.original_chars == len(long) and first.message.content == long[:40] + marker(len(long))
    assert whole.nodes[0].original_chars is None and whole.nodes[0].message.content == long
    got, want = token_sequences(cut), token_sequences(whole)
    assert [(s.input_ids, s.loss_mask, s.logprobs) for s in got] == [
        (s.input_ids, s.loss_mask, s.logprobs) for s in want
    ]
    assert got and sum(got[0].loss_mask) > 0
