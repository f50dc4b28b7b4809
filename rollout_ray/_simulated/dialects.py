"""Token capture in the shapes of vLLM and of SGLang: JSON bodies and SSE chunks.

A request asks for token details with a dialect's request extensions (below); without any,
the server answers in its plain OpenAI shape (``model_server.py``) and none of this applies.

vLLM (shapes recorded from a live vLLM 0.32.0 serving the tiny model of ``scripts/vllm_cpu/``;
``tests/real_server`` checks the real server against them):

- request: ``return_token_ids``, ``logprobs: true`` + ``top_logprobs: k`` (k > 0 needs
  ``logprobs``), ``return_tokens_as_token_ids`` (the server flag
  ``--return-tokens-as-token-ids``; here ``SimulatedModelConfig.return_tokens_as_token_ids``
  or the request field);
- JSON: top level ``prompt_token_ids`` (``null`` without ``return_token_ids``),
  ``prompt_logprobs: null``, ``prompt_text: null``; per choice ``message`` (``role``,
  ``content``, ``tool_calls``, ``reasoning: null``), ``token_ids`` (completion ids),
  ``logprobs.content[]`` of ``{token, logprob, bytes, top_logprobs}`` (top_logprobs: the
  sampled token first, then the true top-k without it, cut at k), ``finish_reason``,
  ``stop_reason: null``; ``len(token_ids) == len(logprobs.content) == completion_tokens``;
- with ``token_id:N`` tokens, the main entry keeps the token's real ``bytes`` and the
  top_logprobs entries carry the bytes of ``"token_id:N"``;
- SSE: the first chunk of each choice is ``delta {role: assistant, content: ""}`` with the
  top-level ``prompt_token_ids`` and ``prompt_text: null``; then one chunk per token with
  ``choices[i].token_ids: [id]`` and its one ``logprobs.content`` entry; the last also has
  ``finish_reason`` and ``stop_reason: null``; a usage chunk (``choices: []``) with
  ``include_usage``;
- aborted: JSON: ``finish_reason: "abort"``, the ids, logprobs and text sampled so far (no
  tool calls parsed); SSE: after the tokens sampled, a chunk ``{delta: {}, finish_reason:
  "abort", stop_reason: null}`` with ``logprobs: {content: []}`` (``null`` without logprobs)
  and ``token_ids: []`` (with ``return_token_ids``).

SGLang (``sgl-project/sglang`` at 004c82e07d876f6e4a0ad6e15325706b0f478f1a, under
``python/sglang/srt/``: ``entrypoints/openai/protocol.py`` — ``ChatCompletionRequest``,
``ChatCompletionResponseChoice``, ``ChatCompletionResponse``, ``UsageInfo``,
``ChatCompletionTokenLogprob``; ``entrypoints/openai/serving_chat.py`` —
``_convert_to_internal_request``, ``_build_chat_response``, ``_process_logprobs_tokens``;
``entrypoints/openai/utils.py`` ``to_openai_style_logprobs`` and
``entrypoints/openai/sse_utils.py`` ``build_sse_content`` (stored versions at 0101654f and
0671305); ``managers/tokenizer_manager.py`` for the ``meta_info`` keys):

- request: ``return_token_ids``, ``return_prompt_token_ids``, ``return_meta_info``,
  ``logprobs``, ``top_logprobs``; the three ``return_*`` with ``stream: true`` are refused
  with 400 in SGLang's flat ``ErrorResponse`` (``{"object": "error", "message", "type",
  "param", "code": 400}``; the ``type`` ``"BadRequest"`` is assumed, not read in the source);
- JSON: per choice ``prompt_token_ids`` (with ``return_token_ids`` or
  ``return_prompt_token_ids``), ``token_ids`` (the output ids, with ``return_token_ids``),
  ``meta_info`` (with ``return_meta_info``: ``id``, ``finish_reason`` ``{type, matched |
  length}``, ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
  ``weight_version``, ``e2e_latency``, and with logprobs ``output_token_logprobs``
  ``[[logprob, id, text], ...]`` and, for k > 0, ``output_top_logprobs``), ``matched_stop``
  (the ``<|im_end|>`` id when the answer stopped on it), ``message`` (``role``, ``content``
  — ``""`` for a tool call —, ``reasoning_content: null``, ``tool_calls`` with ``index``),
  ``logprobs.content[]`` of ``{token, bytes, logprob, top_logprobs}`` (the true top-k, best
  first); top level ``metadata: {weight_version}`` and ``usage`` with
  ``prompt_tokens_details: null``, ``reasoning_tokens: 0``;
- SSE (logprobs only): ``build_sse_content`` chunks (``index, delta, logprobs,
  finish_reason, matched_stop``), one per token that shows something; a finish chunk per
  choice (``delta {}``) after the last token; the usage chunk;
- aborted (``/abort_request``, a graceful abort: no status code): ``finish_reason: "abort"``,
  ``meta_info.finish_reason`` ``{type: "abort", message, status_code: null, err_type: null}``
  (``serving_chat.py`` lets such an abort through as a normal finish). Simplified: SGLang sends a
  tool call's deltas without logprobs and flushes them in an empty-delta chunk; here each
  token's chunk carries both.

Which dialect: SGLang-only fields (``return_prompt_token_ids``, ``return_meta_info``) pick
SGLang, the vLLM-only ``return_tokens_as_token_ids`` picks vLLM; a request with neither
(``return_token_ids`` and ``logprobs`` are in both) or with both gets
``SimulatedModelConfig.dialect``. The completion ids end with the ``<|im_end|>`` the answer
stopped on, in both (as the engines keep the EOS among the output ids; the recipe's sample
stopped on length, so this one is not recorded there).
"""

from __future__ import annotations

from typing import Any

from .completion import Choice, deltas
from .decoding import Token
from .logprobs import Scored
from .request import Capture
from .tokenizer import IM_END, token_bytes, token_text

__all__ = [
    "Event", "sglang_completion", "sglang_end", "sglang_events", "sglang_finish", "sglang_opening", "sglang_token",
    "usage_chunk", "vllm_abort", "vllm_completion", "vllm_events", "vllm_opening", "vllm_token",
]  # fmt: skip

Event = tuple[float, dict[str, Any]]
"""``(seconds to wait before it, chunk)``."""


def _vllm_entry(s: Scored, k: int, as_ids: bool) -> dict[str, Any]:
    def name(token: int) -> str:
        return f"token_id:{token}" if as_ids else token_text(token)

    ranked = [(s.token, s.logprob), *((t, lp) for t, lp in s.ranked if t != s.token)][:k]
    top = [
        {"token": name(t), "logprob": lp, "bytes": list(name(t).encode("utf-8", "surrogatepass"))} for t, lp in ranked
    ]
    return {"token": name(s.token), "logprob": s.logprob, "bytes": token_bytes(s.token), "top_logprobs": top}


def _sglang_entry(s: Scored, k: int) -> dict[str, Any]:
    top = [{"token": token_text(t), "bytes": token_bytes(t), "logprob": lp} for t, lp in s.ranked[:k]]
    return {"token": token_text(s.token), "bytes": token_bytes(s.token), "logprob": s.logprob, "top_logprobs": top}


def _logprobs(scored: tuple[Scored, ...], capture: Capture) -> dict[str, Any] | None:
    if not capture.logprobs:
        return None
    k = capture.top_logprobs
    if capture.dialect == "vllm":
        return {"content": [_vllm_entry(s, k, capture.as_token_ids) for s in scored]}
    return {"content": [_sglang_entry(s, k) for s in scored]}


def _steps(choices: list[Choice]) -> list[list[Token]]:
    """An uninterrupted decoding's tokens, step by step: the choices decode side by side."""
    shown = {c.index: deltas(c) for c in choices}
    longest = max(len(c.ids) for c in choices)
    return [
        [
            Token(c.index, c.ids[j], c.scored[j] if c.scored else None, shown[c.index][j], 0, j == len(c.ids) - 1)
            for c in choices
            if j < len(c.ids)
        ]
        for j in range(longest)
    ]


def vllm_completion(
    head: dict[str, Any], choices: list[Choice], prompt: list[int], usage: dict[str, int], capture: Capture
) -> dict[str, Any]:
    """A vLLM ``chat.completion`` body."""
    out = []
    for c in choices:
        message = {
            "role": "assistant",
            "content": c.message.get("content"),
            "tool_calls": c.message.get("tool_calls") or [],
            "reasoning": None,
        }
        out.append(
            {
                "index": c.index,
                "message": message,
                "logprobs": _logprobs(c.scored, capture),
                "finish_reason": c.finish,
                "stop_reason": None,
                "token_ids": list(c.ids) if capture.token_ids else None,
            }
        )
    return {
        **head,
        "object": "chat.completion",
        "choices": out,
        "usage": usage,
        "prompt_logprobs": None,
        "prompt_token_ids": prompt if capture.token_ids else None,
        "prompt_text": None,
    }


def _chunk(head: dict[str, Any], choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**head, "object": "chat.completion.chunk", "choices": [choice], **extra}


def vllm_opening(head: dict[str, Any], index: int, prompt: list[int], capture: Capture) -> dict[str, Any]:
    """A choice's first vLLM chunk: the role, and with ``return_token_ids`` the prompt ids."""
    first = {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    extra = {"prompt_token_ids": prompt, "prompt_text": None} if capture.token_ids else {}
    return _chunk(head, first, **extra)


def vllm_token(head: dict[str, Any], token: Token, finish: str | None, capture: Capture) -> dict[str, Any]:
    """One token's vLLM chunk (the last one carries the finish reason)."""
    lp = _logprobs((token.scored,) if token.scored else (), capture)
    choice = {"index": token.index, "delta": token.delta, "logprobs": lp, "finish_reason": None}
    if token.last:
        choice.update(finish_reason=finish, stop_reason=None)
    if capture.token_ids:
        choice["token_ids"] = [token.id]
    return _chunk(head, choice)


def vllm_abort(head: dict[str, Any], index: int, capture: Capture) -> dict[str, Any]:
    """The chunk that ends an aborted choice (recorded from vLLM 0.32: no token, empty lists)."""
    choice = {
        "index": index,
        "delta": {},
        "logprobs": {"content": []} if capture.logprobs else None,
        "finish_reason": "abort",
        "stop_reason": None,
    }
    if capture.token_ids:
        choice["token_ids"] = []
    return _chunk(head, choice)


def usage_chunk(head: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    return {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}


def vllm_events(
    head: dict[str, Any],
    choices: list[Choice],
    prompt: list[int],
    usage: dict[str, int] | None,
    capture: Capture,
    ttft: float,
    per_token: float,
) -> list[Event]:
    """An uninterrupted vLLM stream: each choice's first chunk after ``ttft``, then one per
    token and step ``per_token`` apart, then the usage chunk (``usage`` ``None``: none)."""
    events: list[Event] = [(0.0 if c.index else ttft, vllm_opening(head, c.index, prompt, capture)) for c in choices]
    finish = {c.index: c.finish for c in choices}
    for step in _steps(choices):
        events += [(0.0 if n else per_token, vllm_token(head, t, finish[t.index], capture)) for n, t in enumerate(step)]
    if usage is not None:
        events.append((0.0, usage_chunk(head, usage)))
    return events


def sglang_finish(finish: str, tokens: int) -> tuple[dict[str, Any], int | None]:
    """SGLang's ``finish_reason`` object and ``matched_stop`` for a finish after ``tokens``."""
    if finish == "length":
        return {"type": "length", "length": tokens}, None
    if finish == "tool_calls":
        return {"type": "tool_calls", "matched": None}, None
    if finish == "abort":  # an abort a client asked for: no status code (not an error)
        return {"type": "abort", "message": "Aborted by AbortReq.", "status_code": None, "err_type": None}, None
    return {"type": "stop", "matched": IM_END}, IM_END


def _sglang_usage(usage: dict[str, int]) -> dict[str, Any]:
    return {**usage, "prompt_tokens_details": None, "reasoning_tokens": 0}


def _meta_info(
    c: Choice, cid: str, prompt: list[int], version: int, latency: float, capture: Capture
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": cid,
        "finish_reason": sglang_finish(c.finish, len(c.ids))[0],
        "prompt_tokens": len(prompt),
        "weight_version": str(version),
        "completion_tokens": len(c.ids),
        "cached_tokens": 0,
        "e2e_latency": latency,
    }
    if capture.logprobs:
        meta["output_token_logprobs"] = [[s.logprob, s.token, token_text(s.token)] for s in c.scored]
        if capture.top_logprobs:
            k = capture.top_logprobs
            meta["output_top_logprobs"] = [[[lp, t, token_text(t)] for t, lp in s.ranked[:k]] for s in c.scored]
    return meta


def _sglang_choice(
    c: Choice, cid: str, prompt: list[int], version: int, latency: float, capture: Capture
) -> dict[str, Any]:
    calls = c.message.get("tool_calls")
    message = {
        "role": "assistant",
        "content": c.message.get("content") or "",
        "reasoning_content": None,
        "tool_calls": [{**call, "index": i} for i, call in enumerate(calls)] if calls else None,
    }
    out = {
        "index": c.index,
        "message": message,
        "logprobs": _logprobs(c.scored, capture),
        "finish_reason": c.finish,
        "matched_stop": sglang_finish(c.finish, len(c.ids))[1],
    }
    if capture.token_ids or capture.prompt_ids:
        out["prompt_token_ids"] = prompt
    if capture.token_ids:
        out["token_ids"] = list(c.ids)
    if capture.meta_info:
        out["meta_info"] = _meta_info(c, cid, prompt, version, latency, capture)
    return out


def sglang_completion(
    head: dict[str, Any],
    choices: list[Choice],
    prompt: list[int],
    usage: dict[str, int],
    capture: Capture,
    version: int,
    latency: float,
) -> dict[str, Any]:
    """An SGLang ``chat.completion`` body; ``version`` is its ``weight_version``."""
    out = [_sglang_choice(c, head["id"], prompt, version, latency, capture) for c in choices]
    return {
        **head,
        "object": "chat.completion",
        "choices": out,
        "usage": _sglang_usage(usage),
        "metadata": {"weight_version": str(version)},
    }


def _sglang_delta(delta: dict[str, Any]) -> dict[str, Any]:
    """A delta as SGLang's ``ToolCall`` model dumps it: every key, ``None`` when unset."""
    calls = [
        {
            "id": call.get("id"),
            "index": call["index"],
            "type": "function",
            "function": {"name": call["function"].get("name"), "arguments": call["function"].get("arguments", "")},
        }
        for call in delta.get("tool_calls", ())
    ]
    return {"tool_calls": calls} if calls else delta


def _sglang_chunk(
    head: dict[str, Any], index: int, delta: dict[str, Any], lp: Any = None, finish: Any = None, stop: Any = None
) -> dict[str, Any]:
    return _chunk(head, {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish, "matched_stop": stop})


def sglang_opening(head: dict[str, Any], index: int) -> dict[str, Any]:
    return _sglang_chunk(head, index, {"role": "assistant", "content": ""})


def sglang_token(head: dict[str, Any], token: Token, capture: Capture) -> dict[str, Any] | None:
    """One token's SGLang chunk, or ``None`` for a token that shows nothing (the
    ``<|im_end|>`` of a text answer; every token of a tool call is sent)."""
    if token.delta == {"content": ""}:
        return None
    lp = _logprobs((token.scored,) if token.scored else (), capture)
    return _sglang_chunk(head, token.index, _sglang_delta(token.delta), lp)


def sglang_end(head: dict[str, Any], index: int, finish: str, tokens: int) -> dict[str, Any]:
    """The chunk that finishes a choice (an empty delta)."""
    return _sglang_chunk(head, index, {}, None, finish, sglang_finish(finish, tokens)[1])


def sglang_events(
    head: dict[str, Any],
    choices: list[Choice],
    usage: dict[str, int] | None,
    capture: Capture,
    ttft: float,
    per_token: float,
) -> list[Event]:
    """An uninterrupted SGLang stream: a first chunk per choice after ``ttft``; one chunk per
    token that shows something, tokens ``per_token`` apart (a token that shows nothing passes
    its wait on); the finish chunks; the usage chunk (``usage`` ``None``: none)."""
    events: list[Event] = [(0.0 if c.index else ttft, sglang_opening(head, c.index)) for c in choices]
    wait = 0.0
    for step in _steps(choices):
        wait += per_token
        for token in step:
            if (chunk := sglang_token(head, token, capture)) is not None:
                events.append((wait, chunk))
                wait = 0.0
    for c in choices:
        events.append((wait, sglang_end(head, c.index, c.finish, len(c.ids))))
        wait = 0.0
    if usage is not None:
        events.append((0.0, usage_chunk(head, _sglang_usage(usage))))
    return events
