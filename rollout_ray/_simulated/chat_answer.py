"""A chat completion's answer, once the server has admitted it (``model_server.py``).

With token capture (``captured_answer``): decoded token by token on the engine's clock
(``decoding.py``), in vLLM's or SGLang's shape (``dialects.py``), as one JSON body or as SSE.
Without (``plain_answer``): the choices fixed when admitted, the plain OpenAI body after their
latency or its chunks paced over it (``plain.py``); an abort ends every choice with ``"abort"``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any, Protocol

import msgspec
from aiohttp import web

from .answers import prompt_tokens
from .batcher import Batcher
from .completion import Choice, choose
from .decoding import Decoder, Token
from .dialects import (
    sglang_completion,
    sglang_end,
    sglang_opening,
    sglang_token,
    usage_chunk,
    vllm_abort,
    vllm_completion,
    vllm_opening,
    vllm_token,
)  # fmt: skip
from .engine_state import Flight
from .plain import plain_events
from .request import ChatCall
from .request_draws import Attempt
from .served import POLICY_HEADER, Served
from .sse import SSE
from .template import body as assistant_body
from .tokenizer import IM_END, encode


class Answering(Served, Protocol):
    """The server, as its chat answers see it (``SimulatedModelServer``; a protocol, so that
    this module need not import the one that routes to it)."""

    ttft: float
    per_token: float
    batcher: Batcher | None

    def reply(self, status: int, payload: bytes, version: int | None = None) -> web.Response: ...


__all__ = ["captured_answer", "plain_answer", "usage_of"]

_encode = msgspec.json.Encoder().encode


def usage_of(call: ChatCall, choices: list[Choice], prompt: list[int]) -> dict[str, int]:
    tokens = len(prompt) if call.capture.on else prompt_tokens(call.messages)
    completion = sum(c.tokens for c in choices)
    return {"prompt_tokens": tokens, "completion_tokens": completion, "total_tokens": tokens + completion}


async def captured_answer(
    server: Answering,
    request: web.Request,
    call: ChatCall,
    head: dict[str, Any],
    attempt: Attempt,
    prompt: list[int],
    flight: Flight,
) -> web.StreamResponse:
    """A chat completion with token capture, decoded token by token (``decoding.py``)."""
    admitted = server.policy_version
    decoders = [Decoder(i, partial(server.plan, call, attempt.draw, i)) for i in range(call.n)]
    if not call.stream:
        await server.run(flight, decoders, None, prompt)
        choices = [d.choice(admitted) for d in decoders]
        version = max((d.versions[-1] for d in decoders if d.versions), default=admitted)
        usage = usage_of(call, choices, prompt)
        if call.capture.dialect == "vllm":
            body = vllm_completion(head, choices, prompt, usage, call.capture)
        else:
            latency = server.ttft + server.per_token * max(c.tokens for c in choices)
            body = sglang_completion(head, choices, prompt, usage, call.capture, version, latency)
        payload = _encode(body)
        if attempt.fault == "malformed":
            payload = payload[: len(payload) // 2]
        return server.reply(200, payload, version)
    sse = await SSE.open(request, {POLICY_HEADER: str(admitted)}, attempt.fault == "malformed")
    server.stats.by_status[200] += 1
    vllm = call.capture.dialect == "vllm"
    finish = {d.index: d for d in decoders}

    async def emit(tokens: list[Token]) -> None:
        events: list[dict[str, Any] | None] = (
            []
            if sse.sent
            else [
                vllm_opening(head, d.index, prompt, call.capture) if vllm else sglang_opening(head, d.index)
                for d in decoders
            ]
        )
        events.extend(
            vllm_token(head, t, finish[t.index].finish, call.capture) if vllm else sglang_token(head, t, call.capture)
            for t in tokens
        )
        if not await sse.send([e for e in events if e is not None]):
            flight.aborted, flight.cut = True, sse.cut  # nothing more reaches the client

    await server.run(flight, decoders, emit, prompt)
    if vllm:
        events = [vllm_abort(head, d.index, call.capture) for d in decoders if d.finish == "abort"]
    else:
        events = [sglang_end(head, d.index, d.finish or "abort", len(d.ids)) for d in decoders]
    if call.include_usage:
        usage = usage_of(call, [d.choice(admitted) for d in decoders], prompt)
        events.append(
            usage_chunk(head, usage if vllm else {**usage, "prompt_tokens_details": None, "reasoning_tokens": 0})
        )
    await sse.send(events)
    await sse.close()
    return sse.response


async def plain_answer(
    server: Answering,
    request: web.Request,
    call: ChatCall,
    head: dict[str, Any],
    attempt: Attempt,
    flight: Flight,
    prompt: list[int],
) -> web.StreamResponse:
    """A chat completion without token capture: fixed when admitted, the text in pieces."""
    version = server.policy_version
    choices = [choose(call, server.config, attempt.draw, i, version) for i in range(call.n)]
    if server.batcher is not None:  # the batch produces it first (its ids as a template renders them)
        ids = [[*encode(assistant_body(c.message)), IM_END] for c in choices]
        if not await server.batcher.serve(flight, prompt, ids):
            choices = [_aborted(c) for c in choices]
    if call.stream:
        return await _stream(server, request, call, head, choices, flight, attempt.fault == "malformed")
    latency = server.ttft + server.per_token * max(c.tokens for c in choices)
    if not await flight.spend(latency):
        choices = [_aborted(c) for c in choices]
    out = [{"index": c.index, "message": c.message, "logprobs": None, "finish_reason": c.finish} for c in choices]
    body = {**head, "object": "chat.completion", "choices": out, "usage": usage_of(call, choices, [])}
    payload = _encode(body)
    if attempt.fault == "malformed":
        payload = payload[: len(payload) // 2]
    return server.reply(200, payload, version)


async def _stream(
    server: Answering,
    request: web.Request,
    call: ChatCall,
    head: dict[str, Any],
    choices: list[Choice],
    flight: Flight,
    malformed: bool,
) -> web.StreamResponse:
    """Send the plain chunks as SSE on the engine's clock, then ``[DONE]``; an abort ends
    every choice with an ``"abort"`` chunk."""
    sse = await SSE.open(request, {POLICY_HEADER: str(server.policy_version)}, malformed)
    server.stats.by_status[200] += 1
    usage = usage_of(call, choices, []) if call.include_usage else None
    pending: list[Any] = []
    for wait, event in plain_events(head, choices, usage, server.ttft, server.per_token):
        if wait > 0:
            # Chunks due at the same moment go out in one write: fewer syscalls.
            if not await sse.send(pending):
                break
            pending = []
            if not await flight.spend(wait):
                pending = [vllm_abort(head, c.index, call.capture) for c in choices]
                break
        pending.append(event)
    await sse.send(pending)
    await sse.close()
    return sse.response


def _aborted(choice: Choice) -> Choice:
    return replace(choice, message={"role": "assistant", "content": ""}, finish="abort")
