"""The token-in routes: a prompt as token ids (ending, to continue a completion, with the
completion so far), the rest of the completion as token ids, with log-probabilities and the
policy version of each token. What a client continues an interrupted chat completion with:
the prompt ids the chat completion reported, plus the ids it sampled, as one prompt.

The server reads the prompt back (``template.parse``): the conversation before the last
generation prompt is what the model answers, the ids after it are the completion so far,
which it continues (``decoding.py``: under an unchanged version, exactly as if it had never
stopped). The sampling parameters mean what the chat route's do; without ``temperature`` it is
0. ``max_tokens`` counts the new tokens; with those so far they are capped by
``SimulatedModelConfig.max_completion_tokens``. One completion per request (``n`` 1).

vLLM 0.32 (``vllm serve --enable-scale-out``; shapes recorded from the CPU build):
``POST /inference/v1/generate`` ``{"token_ids": [...], "sampling_params": {"max_tokens",
"temperature", "seed", "logprobs": k}, "stream", "return_token_ids", "request_id"}`` →
``{"request_id": "generate-tokens-<id>", "choices": [{"token_ids", "finish_reason",
"logprobs": {"content": [{"token_id", "logprob", "rank", "top_logprobs": [...]}]},
"weight_versions": [{"version", "start", "end"}]}], "usage", ...}``; ``top_logprobs``: the
sampled token first, then the best ``k`` others; ``weight_versions``: the versions of the output
tokens as spans ``[start, end)`` (on the last chunk of a stream). A stream sends one chunk per
token; an aborted one ends with a chunk of no token and ``finish_reason: "abort"``.

SGLang (``/generate``, ``GenerateReqInput``): ``{"input_ids": [...], "sampling_params":
{"max_new_tokens", "temperature", "sampling_seed"}, "return_logprob", "top_logprobs_num",
"stream", "rid"}`` → ``{"text", "output_ids", "meta_info": {"id", "finish_reason": {"type":
...}, "prompt_tokens", "completion_tokens", "weight_version", "output_token_logprobs":
[[logprob, id, null], ...], ...}}``; each streamed chunk is the whole answer so far (SGLang's
default) with the version of its last token.

No faults are injected here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec
from aiohttp import web

from .decoding import Decoder, Token
from .dialects import sglang_finish
from .logprobs import TOP_MAX, Scored
from .request import Capture, ChatCall, Invalid, json_object
from .served import Served
from .sse import SSE
from .template import parse
from .tokenizer import ENDOFTEXT, IM_END, IM_START, decode

__all__ = ["add_token_routes"]

_encode = msgspec.json.Encoder().encode
_HIDDEN = {ENDOFTEXT, IM_START, IM_END}
"""Special tokens SGLang's ``text`` leaves out (``skip_special_tokens``)."""


@dataclass(frozen=True, slots=True)
class _Ask:
    """A token-in request, checked."""

    ids: list[int]
    call: ChatCall
    prefix: list[int]
    conversation: list[int]
    request_id: str | None
    return_prompt: bool


def _field(body: dict[str, Any], name: str, kind: type, low: int | None = None) -> Any:
    value: Any = body.get(name)
    if value is None:
        return None
    if kind is float and type(value) is int:
        value = float(value)
    if type(value) is not kind or (low is not None and value < low):  # type: ignore[operator]  # a number when low is given
        raise Invalid(
            f"'{name}' must be {'an integer' if kind is int else kind.__name__}"
            + (f" of at least {low}" if low is not None else "")
            + ".",
            name,
        )
    return value


def _ask(raw: bytes, server: Served, sglang: bool) -> _Ask:
    body = json_object(raw)
    name = "input_ids" if sglang else "token_ids"
    ids = body.get(name)
    if not isinstance(ids, list) or not ids or not all(type(i) is int and i >= 0 for i in ids):
        raise Invalid(f"'{name}' must be a non-empty list of token ids.", name)
    try:
        decode(ids)
    except ValueError as exc:
        raise Invalid(f"'{name}': {exc}.", name) from None
    params = body.get("sampling_params")
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise Invalid("'sampling_params' must be an object.", "sampling_params")
    new = _field(params, "max_new_tokens" if sglang else "max_tokens", int, 1)
    if _field(params, "n", int, 1) not in (None, 1):
        raise Invalid("'n' must be 1: the simulated model continues one completion per request.", "n")
    if sglang:
        k = (_field(body, "top_logprobs_num", int, 0) or 0) if body.get("return_logprob") else None
    else:
        k = _field(params, "logprobs", int, 0)
    stream = bool(body.get("stream"))
    options = body.get("stream_options")
    parsed = parse(ids)
    cap = server.config.max_completion_tokens
    cap = cap if new is None else min(cap, len(parsed.completion) + new)
    capture = Capture(
        "sglang" if sglang else "vllm", token_ids=True, logprobs=k is not None, top_logprobs=min(k or 0, TOP_MAX)
    )
    call = ChatCall(
        parsed.messages,
        parsed.tools,
        cap,
        stream,
        stream and isinstance(options, dict) and options.get("include_usage") is True,
        1,
        _field(params, "temperature", float, 0) or 0.0,
        _field(params, "sampling_seed" if sglang else "seed", int),
        capture,
    )
    rid = body.get("rid" if sglang else "request_id")
    return _Ask(
        ids,
        call,
        parsed.completion,
        ids[: len(ids) - len(parsed.completion)],
        rid if isinstance(rid, str) and rid else None,
        bool(body.get("return_token_ids")),
    )


def _spans(versions: list[int]) -> list[dict[str, Any]]:
    """vLLM's ``weight_versions``: runs of one version over the output tokens."""
    spans: list[dict[str, Any]] = []
    for i, v in enumerate(versions):
        if spans and spans[-1]["version"] == str(v):
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": str(v), "start": i, "end": i + 1})
    return spans


def _finish(d: Decoder) -> str:
    """A decoder's finish as a token route reports it: it parses no tool calls."""
    return "stop" if d.finish == "tool_calls" else d.finish or "abort"


def _vllm_entry(s: Scored, k: int) -> dict[str, Any]:
    rank = {t: r for r, (t, _) in enumerate(s.ranked, 1)}
    top = [(s.token, s.logprob), *((t, lp) for t, lp in s.ranked[:k] if t != s.token)]
    return {
        "token_id": s.token,
        "logprob": s.logprob,
        "rank": rank[s.token],
        "top_logprobs": [{"token_id": t, "logprob": lp, "rank": rank[t]} for t, lp in top],
    }


def _vllm_choice(d: Decoder, tokens: list[int], scored: list[Scored], capture: Capture, *, final: bool) -> Any:
    logprobs = {"content": [_vllm_entry(s, capture.top_logprobs) for s in scored]} if capture.logprobs else None
    return {
        "index": 0,
        "finish_reason": _finish(d) if final else None,
        "stop_reason": None,
        "token_ids": tokens,
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": _spans(d.versions) if final else None,
        "logprobs": logprobs,
    }


def _usage(ask: _Ask, d: Decoder) -> dict[str, int]:
    done = len(d.ids) - d.start
    return {"prompt_tokens": len(ask.ids), "total_tokens": len(ask.ids) + done, "completion_tokens": done}


def _meta(ask: _Ask, d: Decoder, rid: str, version: int, elapsed: float) -> dict[str, Any]:
    new, scored = d.ids[d.start :], d.scored
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": sglang_finish(_finish(d), len(new))[0] if d.finish else None,
        "prompt_tokens": len(ask.ids),
        "weight_version": str(version),
        "completion_tokens": len(new),
        "cached_tokens": 0,
        "e2e_latency": elapsed,
    }
    if ask.call.capture.logprobs:
        meta["output_token_logprobs"] = [[s.logprob, s.token, None] for s in scored]
        if ask.call.capture.top_logprobs:
            k = ask.call.capture.top_logprobs
            meta["output_top_logprobs"] = [[[lp, t, None] for t, lp in s.ranked[:k]] for s in scored]
    return meta


def add_token_routes(app: web.Application, server: Served) -> None:
    """Add the token-in route of ``server.config.dialect`` to ``app``."""
    sglang = server.config.dialect == "sglang"

    async def generate(request: web.Request) -> web.StreamResponse:
        server.stats.requests += 1
        try:
            ask = _ask(await request.read(), server, sglang)
        except Invalid as exc:
            error = {"message": str(exc), "type": "BadRequestError", "param": exc.param, "code": 400}
            return web.Response(status=400, body=_encode({"error": error}), content_type="application/json")
        attempt = server.attempts.next(b"\0ids\0" + _encode(ask.ids), server.attempts.conversation(ask.conversation))
        given = request.headers.get("X-Request-Id") or ask.request_id or attempt.cid.removeprefix("chatcmpl-")
        rid = given if sglang else f"generate-tokens-{given}"
        await server.engine.admit()
        with server.flight(rid) as flight:
            decoder = Decoder(0, partial(server.plan, ask.call, attempt.draw, 0), ask.prefix)
            if sglang:
                return await _sglang(request, server, ask, decoder, rid, flight)
            return await _vllm(request, server, ask, decoder, rid, flight)

    app.router.add_post("/generate" if sglang else "/inference/v1/generate", generate)


async def _vllm(
    request: web.Request, server: Served, ask: _Ask, d: Decoder, rid: str, flight: Any
) -> web.StreamResponse:
    capture = ask.call.capture
    if not ask.call.stream:
        await server.run(flight, [d], None, ask.ids)
        body = {
            "request_id": rid,
            "model": server.config.model_name,
            "created": int(time.time()),
            "usage": {**_usage(ask, d), "prompt_tokens_details": None, "completion_tokens_details": None},
            "prompt_logprobs": None,
            "prompt_token_id_logprobs": None,
            "prompt_token_ids": ask.ids if ask.return_prompt else None,
            "mm_placeholders": None,
            "metrics": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "output_mode": "tokens",
            "choices": [_vllm_choice(d, d.ids[d.start :], d.scored, capture, final=True)],
        }
        return web.Response(body=_encode(body), content_type="application/json")
    sse = await SSE.open(request, {})

    def chunk(choice: Any, first: bool) -> dict[str, Any]:
        head: dict[str, Any] = {"request_id": rid, "usage": None}
        if first and ask.return_prompt:
            head["prompt_token_ids"] = ask.ids
        return {**head, "output_mode": "tokens", "choices": [choice]}

    async def emit(tokens: list[Token]) -> None:
        events = [
            chunk(
                _vllm_choice(d, [t.id], [t.scored] if t.scored else [], capture, final=t.last), sse.sent == 0 and n == 0
            )
            for n, t in enumerate(tokens)
        ]
        if not await sse.send(events):
            flight.aborted = True

    await server.run(flight, [d], emit, ask.ids)
    events: list[Any] = (
        [] if d.finish != "abort" else [chunk(_vllm_choice(d, [], [], capture, final=True), sse.sent == 0)]
    )
    if ask.call.include_usage:
        events.append({"request_id": rid, "output_mode": "tokens", "choices": [], "usage": _usage(ask, d)})
    await sse.send(events)
    await sse.close()
    return sse.response


async def _sglang(
    request: web.Request, server: Served, ask: _Ask, d: Decoder, rid: str, flight: Any
) -> web.StreamResponse:
    def answer() -> dict[str, Any]:
        new = d.ids[d.start :]
        version = d.versions[-1] if d.versions else server.policy_version
        return {
            "text": decode(i for i in new if i not in _HIDDEN),
            "output_ids": new,
            "meta_info": _meta(ask, d, rid, version, flight.elapsed()),
        }

    if not ask.call.stream:
        await server.run(flight, [d], None, ask.ids)
        return web.Response(body=_encode(answer()), content_type="application/json")
    sse = await SSE.open(request, {})

    async def emit(tokens: list[Token]) -> None:
        if tokens and not await sse.send([answer()]):
            flight.aborted = True

    await server.run(flight, [d], emit, ask.ids)
    if d.finish == "abort" or not d.versions:
        await sse.send([answer()])
    await sse.close()
    return sse.response
