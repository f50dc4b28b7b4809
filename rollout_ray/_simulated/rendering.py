"""vLLM's rendering routes, for a client that speaks token ids (token in, token out):

- ``POST /tokenize`` ``{"messages", "tools", "add_generation_prompt": true}`` or ``{"prompt":
  "..."}`` → ``{"count", "max_model_len", "tokens", "token_strs": null}``: the chat template's
  ids (``template.render``), without the generation prompt if asked, or a text's ids;
- ``POST /v1/chat/completions/render`` (a Chat Completions body) → vLLM's ``GenerateRequest``:
  ``{"request_id", "token_ids", "sampling_params": {"temperature", "max_tokens", "seed"},
  "model", "stream", ...}``, what ``/inference/v1/generate`` takes;
- ``POST /v1/chat/completions/derender`` ``{"generate_response": {"choices": [{"index",
  "token_ids", "finish_reason", "logprobs"}]}, "chat_request", "prompt_token_ids",
  "prompt_tokens"}`` → a ``chat.completion`` whose message is the ids read back as the
  template writes a reply (content, then Hermes tool calls), with ``logprobs.content`` in the
  chat shape when the chat request asked for it; the ``finish_reason`` given stays;
- ``POST /inference/v1/abort_requests`` ``{"request_ids": [...]}`` → 200, no body.

The last three need ``SimulatedModelConfig.scale_out`` (vLLM's ``--enable-scale-out``) and
answer 403 without it, as vLLM does; ``/tokenize`` always answers. Shapes recorded from vLLM
0.32's CPU build (its tiny model; ``docs/`` of the interrupt recipe).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec
from aiohttp import web

from .request import Invalid, json_object, parse
from .served import Served
from .template import GENERATION_HEADER, assistant, render
from .tokenizer import ENDOFTEXT, IM_END, decode, encode, token_bytes, token_text

__all__ = ["add_rendering_routes"]

_encode = msgspec.json.Encoder().encode
_HIDDEN = {ENDOFTEXT, IM_END}
"""Ids a reply's text leaves out (the stop tokens)."""
SCALE_OUT_OFF = (
    "Scale-out endpoints are disabled. Start the server with --enable-scale-out to use "
    "/v1/chat/completions/render, /v1/chat/completions/derender and /inference/v1/*."
)


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=_encode(payload), content_type="application/json")


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    kind = "BadRequestError" if status == 400 else "Forbidden"
    return _json({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)


def _tokens(body: dict[str, Any], drift: bool) -> list[int]:
    messages = body.get("messages")
    if messages is None:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise Invalid("'prompt' or 'messages' is required.", "prompt")
        return encode(prompt)
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise Invalid("'messages' must be an array of message objects.", "messages")
    ids = render(messages, body.get("tools"), drift=drift)
    if body.get("add_generation_prompt", True) is False:
        ids = ids[: len(ids) - 1 - len(encode(GENERATION_HEADER))]  # render ends with the generation prompt
    return ids


def _chat_logprobs(entries: list[Any]) -> list[dict[str, Any]]:
    """Token-route logprob entries (by id) as Chat Completions' (by token text)."""

    def entry(e: dict[str, Any]) -> dict[str, Any]:
        token = e["token_id"]
        return {"token": token_text(token), "logprob": e["logprob"], "bytes": token_bytes(token)}

    return [{**entry(e), "top_logprobs": [entry(t) for t in e.get("top_logprobs") or ()]} for e in entries]


def _reply(body: dict[str, Any]) -> dict[str, Any]:
    response = body.get("generate_response")
    choices = response.get("choices") if isinstance(response, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise Invalid("'generate_response.choices' must hold one choice.", "generate_response")
    choice = choices[0]
    ids = choice.get("token_ids")
    if not isinstance(ids, list) or not ids:
        raise Invalid("choice 0 has empty or null token_ids", None)
    chat = body.get("chat_request")
    if not isinstance(chat, dict):
        chat = {}
    before = sum(len(m.get("tool_calls") or ()) for m in chat.get("messages") or () if isinstance(m, dict))
    message = assistant(decode(i for i in ids if i not in _HIDDEN), before)
    logprobs = choice.get("logprobs") if chat.get("logprobs") else None
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    prompt = body.get("prompt_tokens") or 0
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": chat.get("model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "reasoning": None, **message},
                "logprobs": {"content": _chat_logprobs(content)} if isinstance(content, list) else None,
                "finish_reason": choice.get("finish_reason"),
                "token_ids": None,
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": len(ids), "total_tokens": prompt + len(ids)},
    }


def add_rendering_routes(app: web.Application, server: Served) -> None:
    """Add the rendering routes of a vLLM-dialect ``server`` to ``app``."""
    config = server.config

    def route(handler: Any, scale_out: bool = True) -> Any:
        async def answer(request: web.Request) -> web.Response:
            if scale_out and not config.scale_out:
                return _error(403, SCALE_OUT_OFF)
            try:
                return _json(handler(await request.read()))
            except Invalid as exc:
                return _error(400, str(exc), exc.param)

        return answer

    def tokenize(raw: bytes) -> Any:
        ids = _tokens(json_object(raw), config.template_drift)
        return {"count": len(ids), "max_model_len": None, "tokens": ids, "token_strs": None}

    def render_chat(raw: bytes) -> Any:
        body, call = json_object(raw), parse(raw, config)
        return {
            "request_id": f"chatcmpl-{call.request_id or uuid.uuid4().hex[:16]}",
            "token_ids": render(call.messages, call.tools, drift=config.template_drift),
            "sampling_params": {"temperature": call.temperature, "max_tokens": call.cap, "seed": call.seed},
            "model": body.get("model"),
            "stream": call.stream,
            "output_mode": "tokens",
        }

    async def abort(request: web.Request) -> web.Response:
        if not config.scale_out:
            return _error(403, SCALE_OUT_OFF)
        try:
            ids = json_object(await request.read()).get("request_ids")
        except Invalid as exc:
            return _error(400, str(exc))
        if not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
            return _error(400, "Missing 'request_ids' in request body")
        server.engine.abort(ids)
        return web.Response(status=200)

    app.router.add_post("/tokenize", route(tokenize, scale_out=False))
    app.router.add_post("/v1/chat/completions/render", route(render_chat))
    app.router.add_post("/v1/chat/completions/derender", route(lambda raw: _reply(json_object(raw))))
    app.router.add_post("/inference/v1/abort_requests", abort)
