"""Token in, token out: a model call sent as token ids, which can be interrupted and continued.

For a server with vLLM's scale-out routes (``vllm serve --enable-scale-out``, and the simulated
model with ``scale_out=True``), ``OpenAIModel`` makes each call here instead of on the Chat
Completions route:

1. **Render** the harness's request (``POST /v1/chat/completions/render``): the server's own
   prompt ids and the sampling parameters its chat route would use.
2. **The prompt.** The first turn's prompt is the rendered one. A later turn's is built on the
   ids the branch already has (``CallContext.prefix_ids``: the previous turn's prompt and its
   completion, as sampled): those ids, the template's end of an assistant turn where the
   sampled ids lack it, then the ids of only the new messages: the rendered prompt after the
   rendering of the messages the prefix holds (``POST /tokenize``, no generation prompt). So a
   sampled reply is never re-tokenized and a multi-turn rollout stays one training sequence.
   A template that rewrites history on purpose (the rendering of the earlier messages is not a
   prefix of the new prompt: it drops earlier reasoning, say) gets the rendered prompt: a new
   sequence, counted in ``token_drift``, as on the chat route.
3. **Generate** (``POST /inference/v1/generate``, ``X-Request-Id``): ids, logprobs and, per
   token, the policy version (vLLM's ``weight_versions``). If the call's interrupt fires
   (``_core/policy_gate``), the request is aborted at the server (``POST
   /inference/v1/abort_requests``, and the connection closed if it does not end within
   ``ABORT_GRACE``), what it sampled is kept and ``Interrupted`` is raised; ``continue_``
   sends the prompt plus those ids and asks for the rest, with the same sampling parameters.
4. **Derender** every id of the reply (``POST /v1/chat/completions/derender``): the message
   the harness sees (content and tool calls, by the server's tool parser) and its
   ``logprobs.content`` if it asked. The harness sees one reply however often it was stopped.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from .._core.model import CallContext, Interrupted
from .._core.policy_gate import Interrupt
from .._errors import OverlongPromptError, ProviderError, WireError
from .._record.messages import AssistantMessage, Response, Usage
from .._record.openai_codec import parse_response
from .affinity import Server
from .upstream_wire import POLICY_HEADER, Transient, check_status, int_or_none, reap, sse_data, unreachable

log = logging.getLogger("rollout_ray")

ABORT_GRACE = 5.0
"""Seconds an aborted generation may take to end before its connection is closed."""
ABORT_REPEAT = 0.5
"""Seconds between abort requests while an aborted generation has not ended."""
_DUMMIES = tuple(
    [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": f"Hello, World{end}"}] for end in ".!"
)
"""Two conversations whose renderings differ only in the reply's last character: what follows
it, the same in both, is the template's end of an assistant turn."""
_decode = msgspec.json.decode
_encode = msgspec.json.encode


@dataclass
class Partial:
    """What a token-in call has sampled, and what continuing it needs."""

    prompt: list[int]
    params: dict[str, Any]
    """The sampling parameters of every segment (``max_tokens``: the whole reply's)."""
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entries: list[Any] = field(default_factory=list)
    """The logprob entries as the server sent them, for the harness (if it asked)."""
    versions: list[int | None] = field(default_factory=list)
    stamp: int | None = None
    """The version the server stamped on the first segment (``X-Policy-Version``)."""
    finish: str | None = None


class _Logprob(msgspec.Struct):
    logprob: float


class _Choice(msgspec.Struct):
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None
    weight_versions: list[dict[str, Any]] | None = None


class _Answer(msgspec.Struct):
    choices: list[_Choice] = msgspec.field(default_factory=list)


_ANSWER = msgspec.json.Decoder(_Answer)


class TokenIn:
    """The token-in calls of one ``OpenAIModel``.

    Args:
        client: the model's connection pool.
        headers: the headers of every request (content type, authorization).
        timeout: seconds for one request.
        stream: ask for a stream on the generation route.
    """

    def __init__(
        self, client: Callable[[], aiohttp.ClientSession], headers: dict[str, str], timeout: float, stream: bool
    ) -> None:
        self._client, self._headers, self._timeout, self._stream = client, headers, timeout, stream
        self._glue: dict[str, list[int]] = {}
        self._warned: set[str] = set()

    async def supported(self, server: Server, model: str | None) -> bool:
        """Whether ``server`` answers the render route (vLLM's ``--enable-scale-out``)."""
        body = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
        try:
            async with asyncio.timeout(min(self._timeout, 10.0)):
                async with self._client().post(
                    server.root + "/v1/chat/completions/render", json=body, headers=self._headers
                ) as resp:
                    await resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise unreachable(server.root, e) from None
        return resp.status == 200

    async def start(self, server: Server, chat: dict[str, Any], call: CallContext) -> Partial:
        """Render ``chat`` and build its prompt (token in)."""
        rendered = await self._post(server, "/v1/chat/completions/render", chat)
        full: list[int] = rendered["token_ids"]
        params = dict(rendered["sampling_params"])
        prompt = await self._prompt(server, full, chat, call)
        limit = params.get("max_tokens")
        asked = chat.get("max_completion_tokens") or chat.get("max_tokens")
        # The render caps max_tokens at what the context leaves after its prompt; only then does a
        # longer prompt of ours shorten the reply (kept ids may outnumber their re-rendering).
        if isinstance(limit, int) and prompt is not full and (not isinstance(asked, int) or limit < asked):
            params["max_tokens"] = min(limit, len(full) + limit - len(prompt))
            if params["max_tokens"] < 1:
                raise OverlongPromptError(
                    f"the prompt of {len(prompt)} token ids leaves no room in the context window", 400
                )
        return Partial(prompt, params)

    async def continue_(
        self, server: Server, chat: dict[str, Any], partial: Partial, call: CallContext, wants: bool
    ) -> Response:
        """Generate the rest of ``partial``'s reply: the whole reply, or ``Interrupted``."""
        interrupt = call.interrupt
        limit = partial.params.get("max_tokens")
        left = None if limit is None else limit - len(partial.ids)
        if interrupt is not None and interrupt.fired:
            raise Interrupted(len(partial.ids), partial)
        if left is None or left > 0:
            top = chat.get("top_logprobs") if wants else 0
            params = {**partial.params, "logprobs": top or 0, **({} if left is None else {"max_tokens": left})}
            await self._generate(server, partial, params, interrupt, chat.get("model"))
            if partial.finish == "abort":
                raise Interrupted(len(partial.ids), partial)
        else:
            partial.finish = "length"
        return await self._reply(server, chat, partial, wants)

    # -- the prompt -----------------------------------------------------------------------------

    async def _prompt(self, server: Server, full: list[int], chat: dict[str, Any], call: CallContext) -> list[int]:
        messages = chat["messages"]
        prefix, held = call.prefix_ids, call.prefix_messages
        if prefix is None or not 0 < held < len(messages):
            return full
        tools = chat.get("tools")
        history = await self._tokenize(
            server,
            {"messages": messages[:held], "tools": tools, "add_generation_prompt": False, "model": chat.get("model")},
        )
        if full[: len(history)] != history:
            if server.url not in self._warned:
                self._warned.add(server.url)
                log.info(
                    "token in: the chat template of %s rewrites earlier turns; such a turn starts a new "
                    "sequence (token_drift)",
                    server.url,
                )
            return full
        glue = await self._template_glue(server, chat.get("model"))
        return prefix + glue[_overlap(prefix, glue) :] + full[len(history) :]

    async def _template_glue(self, server: Server, model: str | None) -> list[int]:
        """The ids the template writes after an assistant message's content (its end of turn)."""
        glue = self._glue.get(server.url)
        if glue is None:
            a, b = [
                await self._tokenize(server, {"messages": d, "add_generation_prompt": False, "model": model})
                for d in _DUMMIES
            ]
            size = next((k for k in range(min(len(a), len(b))) if a[len(a) - 1 - k] != b[len(b) - 1 - k]), 0)
            glue = self._glue[server.url] = a[len(a) - size :] if size else []
        return glue

    async def _tokenize(self, server: Server, body: dict[str, Any]) -> list[int]:
        tokens: list[int] = (await self._post(server, "/tokenize", body))["tokens"]
        return tokens

    # -- the generation ---------------------------------------------------------------------------

    async def _generate(
        self, server: Server, partial: Partial, params: dict[str, Any], interrupt: Interrupt | None, model: str | None
    ) -> None:
        """One request on the generation route; what it samples is added to ``partial``."""
        rid = uuid.uuid4().hex
        body: dict[str, Any] = {
            "token_ids": partial.prompt + partial.ids,
            "sampling_params": params,
            "request_id": rid,
            "model": model,
        }
        if self._stream:
            body.update(stream=True, stream_options={"include_usage": True})
        headers = {**self._headers, "X-Request-Id": rid}
        piece = _Piece(first=not partial.ids and partial.stamp is None)
        reading = asyncio.ensure_future(self._read(server, _encode(body), headers, piece))
        if interrupt is not None:
            interrupt.arm()
            waiting = asyncio.ensure_future(interrupt.wait())
            try:
                await asyncio.wait({reading, waiting}, return_when=asyncio.FIRST_COMPLETED)
                if not reading.done():
                    piece.interrupted = True
                    await self._abort(server, f"generate-tokens-{rid}", reading)
            finally:  # also when a run's final cancel cuts the call here: the reader goes with it
                reap(waiting, reading)
        try:
            await reading
        except (asyncio.CancelledError, aiohttp.ClientError, WireError):
            if not piece.interrupted:
                raise
            piece.finish = "abort"  # stopped here: what was read is kept
        piece.add_to(partial)

    async def _read(self, server: Server, body: bytes, headers: dict[str, str], piece: _Piece) -> None:
        url = server.root + "/inference/v1/generate"
        server.inflight += 1
        try:
            async with asyncio.timeout(self._timeout):
                try:
                    resp = await self._client().post(url, data=body, headers=headers)
                except aiohttp.ClientError as e:
                    raise unreachable(url, e) from None
                async with resp:
                    await check_status(resp)
                    piece.stamp = int_or_none(resp.headers.get(POLICY_HEADER))
                    if self._stream:
                        async for data in sse_data(resp):
                            if data == b"[DONE]":
                                break
                            piece.feed(data)
                    else:
                        piece.feed(await resp.read())
        except TimeoutError:
            raise Transient(ProviderError(f"model request timed out after {self._timeout:g}s", 504)) from None
        finally:
            server.inflight -= 1

    async def _abort(self, server: Server, request_id: str, reading: asyncio.Future[None]) -> None:
        """Abort ``request_id`` at ``server`` until ``reading`` ends; close it after ``ABORT_GRACE``."""
        url = server.root + "/inference/v1/abort_requests"
        try:
            async with asyncio.timeout(ABORT_GRACE):
                while not reading.done():
                    try:
                        async with self._client().post(
                            url, json={"request_ids": [request_id]}, headers=self._headers
                        ) as resp:
                            await resp.read()
                    except aiohttp.ClientError:
                        pass  # the connection's close below aborts it too
                    await asyncio.wait({reading}, timeout=ABORT_REPEAT)
        except TimeoutError:
            reading.cancel()

    # -- the reply --------------------------------------------------------------------------------

    async def _reply(self, server: Server, chat: dict[str, Any], partial: Partial, wants: bool) -> Response:
        finish = partial.finish or "stop"
        usage = Usage(prompt_tokens=len(partial.prompt), completion_tokens=len(partial.ids))
        if partial.ids:
            choice: dict[str, Any] = {"index": 0, "token_ids": partial.ids, "finish_reason": finish}
            if wants:
                choice["logprobs"] = {"content": partial.entries}
            body = {
                "generate_response": {"choices": [choice]},
                "chat_request": chat,
                "prompt_token_ids": partial.prompt,
                "prompt_tokens": len(partial.prompt),
            }
            raw = await self._post(server, "/v1/chat/completions/derender", body, raw=True)
            try:
                reply = parse_response(raw, logprobs=wants)
            except WireError as e:
                raise ProviderError(str(e), 502) from None
            message, logprobs = reply.message, reply.logprobs
        else:
            message, logprobs = AssistantMessage(content=""), [] if wants else None
        if finish not in ("stop", "length"):
            finish = "stop"
        if finish == "stop" and message.tool_calls:
            finish = "tool_calls"
        return Response(
            message,
            finish,  # type: ignore[arg-type]
            usage,
            chat.get("model"),
            logprobs,
            prompt_token_ids=partial.prompt,
            token_ids=list(partial.ids),
            token_logprobs=list(partial.logprobs),
            policy_version=partial.stamp,
            token_versions=list(partial.versions),
        )

    async def _post(self, server: Server, route: str, body: dict[str, Any], raw: bool = False) -> Any:
        url = server.root + route
        try:
            async with asyncio.timeout(self._timeout):
                try:
                    resp = await self._client().post(url, data=_encode(body), headers=self._headers)
                except aiohttp.ClientError as e:
                    raise unreachable(url, e) from None
                async with resp:
                    await check_status(resp)
                    data = await resp.read()
        except TimeoutError:
            raise Transient(ProviderError(f"model request {route} timed out after {self._timeout:g}s", 504)) from None
        except aiohttp.ClientError as e:
            raise ProviderError(f"the model's answer from {url} was cut short: {e}", 502) from None
        if raw:
            return data
        try:
            return _decode(data)
        except msgspec.DecodeError as e:
            raise ProviderError(f"malformed answer from {url}: {e}", 502) from None


class _Piece:
    """What one generation request sampled."""

    def __init__(self, first: bool) -> None:
        self.first = first
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.entries: list[Any] = []
        self.versions: list[int | None] | None = None
        self.finish: str | None = None
        self.stamp: int | None = None
        self.interrupted = False

    def feed(self, data: bytes) -> None:
        try:
            answer = _ANSWER.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            raise WireError(f"malformed answer from the token route: {e}") from None
        for choice in answer.choices:
            ids = choice.token_ids or []
            self.ids += ids
            content = (choice.logprobs or {}).get("content") or []
            self.entries += content
            self.logprobs += [entry["logprob"] for entry in content]
            if choice.weight_versions is not None:
                self.versions = _spans(choice.weight_versions, len(self.ids))
            self.finish = choice.finish_reason or self.finish

    def add_to(self, partial: Partial) -> None:
        if self.first:
            partial.stamp = self.stamp
        partial.ids += self.ids
        partial.entries += self.entries
        partial.logprobs += self.logprobs if len(self.logprobs) == len(self.ids) else [float("nan")] * len(self.ids)
        versions = self.versions if self.versions is not None else [self.stamp] * len(self.ids)
        partial.versions += versions
        partial.finish = self.finish


def _spans(spans: list[dict[str, Any]], size: int) -> list[int | None]:
    """vLLM's ``weight_versions`` (``{"version", "start", "end"}`` over the output) per token."""
    versions: list[int | None] = [None] * size
    for span in spans:
        version = int_or_none(span.get("version"))
        for i in range(max(0, span.get("start", 0)), min(size, span.get("end", 0))):
            versions[i] = version
    return versions


def _overlap(prefix: list[int], glue: list[int]) -> int:
    """The longest end of ``prefix`` that begins ``glue`` (a turn the model ended itself)."""
    for size in range(min(len(prefix), len(glue)), 0, -1):
        if prefix[-size:] == glue[:size]:
            return size
    return 0
