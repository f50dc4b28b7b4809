"""The built-in simulated model: a deterministic, OpenAI-compatible chat completions server.

Determinism: every ``POST /v1/chat/completions`` is keyed by ``blake2b(seed, messages)``,
where ``messages`` is the request's ``messages`` array re-encoded as compact JSON (key
order as sent). The server counts how often it has seen each key; the n-th request with a
key (n = 0, 1, ...) draws its fault, its error draw and its completion id from
``blake2b(key, n)``. So the same config and the same requests give the same answers and
faults whatever order concurrent requests arrive in, and a retry of a failed request gets
fresh draws. Keys are kept for the server's life (16 bytes plus a count each).
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from .config import SimulatedModelConfig
from .policy import cap_completion, prompt_tokens, respond

__all__ = ["SimulatedModelConfig", "SimulatedModelServer", "SimulatedModelStats", "serve_forever"]

FAULTS = ("429", "5xx", "timeout", "malformed")
SERVER_ERRORS = (500, 502, 503)
STREAM_PIECES = 4
# Long enough for in-flight answers to finish, short enough that stop() never hangs.
SHUTDOWN_TIMEOUT = 1.0
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


@dataclass
class SimulatedModelStats:
    """Counts of chat completion requests (``/v1/models`` is not counted)."""

    requests: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    by_fault: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class _Call:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    cap: int
    stream: bool
    include_usage: bool


class _Invalid(Exception):
    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def _pieces(text: str) -> list[str]:
    size = max(1, -(-len(text) // STREAM_PIECES))
    return [text[i : i + size] for i in range(0, len(text), size)]


class SimulatedModelServer:
    """An aiohttp server for one :class:`SimulatedModelConfig`; ``async with`` starts it on
    127.0.0.1 with a free port (unless already started) and stops it."""

    def __init__(self, config: SimulatedModelConfig | None = None) -> None:
        self.config = config or SimulatedModelConfig()
        self.stats = SimulatedModelStats()
        self.base_url: str | None = None
        self._seen: dict[bytes, int] = {}
        self._seed = f"{self.config.seed}\0".encode()
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Bind and serve; returns the base URL ``http://HOST:PORT/v1``."""
        if self._runner is not None:
            raise RuntimeError("SimulatedModelServer is already started")
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            bound = runner.addresses[0][1]
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._stopping = runner, asyncio.Event()
        self.base_url = f"http://{f'[{host}]' if ':' in host else host}:{bound}/v1"
        return self.base_url

    async def stop(self) -> None:
        """Release held requests, close every connection and the socket. Idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            self._stopping.set()
            await runner.cleanup()

    async def __aenter__(self) -> SimulatedModelServer:
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": self.config.model_name, "object": "model", "owned_by": "rollout_ray"}]
        payload = _encode({"object": "list", "data": data})
        return web.Response(body=payload, content_type="application/json")

    def _reply(self, status: int, payload: bytes) -> web.Response:
        self.stats.by_status[status] += 1
        return web.Response(status=status, body=payload, content_type="application/json")

    def _error(
        self,
        status: int,
        message: str,
        kind: str,
        param: str | None = None,
        code: str | None = None,
    ) -> web.Response:
        """An OpenAI-style error body: ``{"error": {message, type, param, code}}``."""
        error = {"message": message, "type": kind, "param": param, "code": code}
        return self._reply(status, _encode({"error": error}))

    def _draw(self, messages: list[Any]) -> tuple[str | None, float, int, str]:
        """``(fault, error draw, 5xx status, completion id)`` for this request."""
        key = hashlib.blake2b(self._seed + _encode(messages), digest_size=16).digest()
        attempt = self._seen.get(key, 0)
        self._seen[key] = attempt + 1
        d = hashlib.blake2b(key + attempt.to_bytes(8, "big"), digest_size=28).digest()
        u_fault = int.from_bytes(d[:8], "big") / 2**64
        u_error = int.from_bytes(d[8:16], "big") / 2**64
        cfg, fault, edge = self.config, None, 0.0
        rates = (cfg.rate_429, cfg.rate_5xx, cfg.rate_timeout, cfg.rate_malformed)
        for name, rate in zip(FAULTS, rates):
            edge += rate
            if u_fault < edge:
                fault = name
                break
        return fault, u_error, SERVER_ERRORS[(key[0] + attempt) % 3], "chatcmpl-" + d[16:].hex()

    def _parse(self, raw: bytes) -> _Call:
        """The request's fields; raises ``_Invalid`` naming the offending one."""
        try:
            body = _decode(raw)
        except msgspec.DecodeError:
            raise _Invalid("We could not parse the JSON body of your request.", None) from None
        if not isinstance(body, dict):
            raise _Invalid("The request body must be a JSON object.", None)
        messages = body.get("messages")
        if messages is None:
            raise _Invalid("Missing required parameter: 'messages'.", "messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise _Invalid("'messages' must be an array of message objects.", "messages")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise _Invalid("'tools' must be an array.", "tools")
        cap = self.config.max_completion_tokens
        for name in ("max_tokens", "max_completion_tokens"):
            value = body.get(name)
            if value is not None and (type(value) is not int or value < 1):
                raise _Invalid(f"'{name}' must be a positive integer.", name)
            cap = cap if value is None else min(cap, value)
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise _Invalid("'stream' must be a boolean.", "stream")
        options = body.get("stream_options")
        usage = bool(stream) and isinstance(options, dict) and options.get("include_usage") is True
        return _Call(messages, tools, cap, bool(stream), usage)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.stats.requests += 1
        cfg = self.config
        try:
            call = self._parse(await request.read())
        except _Invalid as exc:
            return self._error(400, str(exc), "invalid_request_error", exc.param)
        fault, u_error, status_5xx, cid = self._draw(call.messages)
        if fault is not None:
            self.stats.by_fault[fault] += 1
        if fault == "429":
            message, code = "Rate limit reached (simulated).", "rate_limit_exceeded"
            return self._error(429, message, "rate_limit_error", code=code)
        if fault == "5xx":
            return self._error(status_5xx, "The server had an error (simulated).", "server_error")
        if fault == "timeout":
            try:
                await asyncio.wait_for(self._stopping.wait(), cfg.timeout_hold)
            except TimeoutError:
                pass
            return self._error(504, "Upstream timed out (simulated).", "timeout")
        message = respond(call.messages, call.tools, cfg, u_error)
        message, finish, completion = cap_completion(message, call.cap)
        prompt = prompt_tokens(call.messages)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion}
        usage["total_tokens"] = prompt + completion
        head = {"id": cid, "created": int(time.time()), "model": cfg.model_name}
        if call.stream:
            events = self._events(head, message, finish, usage, call.include_usage)
            return await self._stream(request, events, fault == "malformed")
        delay = cfg.ttft + cfg.per_token * completion
        if delay > 0:
            await asyncio.sleep(delay)
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        completion_json = {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
        payload = _encode(completion_json)
        if fault == "malformed":
            payload = payload[: len(payload) // 2]
        return self._reply(200, payload)

    def _events(
        self,
        head: dict[str, Any],
        message: dict[str, Any],
        finish: str,
        usage: dict[str, int],
        include_usage: bool,
    ) -> list[tuple[float, dict[str, Any]]]:
        """``(seconds to wait before it, chunk)`` pairs; the waits add up to
        ``ttft + per_token * completion_tokens``, as for a non-streamed answer."""
        head = {**head, "object": "chat.completion.chunk"}
        if include_usage:
            head["usage"] = None

        def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            return {**head, "choices": [choice]}

        role = chunk({"role": "assistant", "content": ""})
        events: list[tuple[float, dict[str, Any]]] = [(self.config.ttft, role)]
        calls = message.get("tool_calls")
        if calls:
            call, fn = calls[0], calls[0]["function"]
            opening = {"index": 0, "id": call["id"], "type": "function"}
            opening["function"] = {"name": fn["name"], "arguments": ""}
            events.append((0.0, chunk({"tool_calls": [opening]})))
            text = fn["arguments"]
        else:
            text = message["content"]
        per_char = self.config.per_token * usage["completion_tokens"] / max(1, len(text))
        for piece in _pieces(text):
            if calls:
                delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
            else:
                delta = {"content": piece}
            events.append((per_char * len(piece), chunk(delta)))
        events.append((0.0, chunk({}, finish)))
        if include_usage:
            events.append((0.0, {**head, "choices": [], "usage": usage}))
        return events

    async def _stream(
        self, request: web.Request, events: list[tuple[float, dict[str, Any]]], malformed: bool
    ) -> web.StreamResponse:
        """Send ``events`` as SSE, then ``[DONE]``; malformed: cut short in the second event."""
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        response = web.StreamResponse(headers=headers)
        self.stats.by_status[200] += 1
        await response.prepare(request)
        pending: list[bytes] = []
        try:
            for i, (wait, event) in enumerate(events):
                if wait > 0:
                    # Chunks due at the same moment go out in one write: fewer syscalls.
                    if pending:
                        await response.write(b"".join(pending))
                        pending.clear()
                    await asyncio.sleep(wait)
                data = _encode(event)
                if malformed and i == 1:
                    # Cut the stream mid-event: no terminating blank line, no [DONE].
                    pending.append(b"data: " + data[: len(data) // 2])
                    break
                pending.append(b"data: " + data + b"\n\n")
            else:
                pending.append(b"data: [DONE]\n\n")
            await response.write(b"".join(pending))
            await response.write_eof()
        except ConnectionResetError:
            pass  # The client went away (e.g. it timed out); nothing is left to tell it.
        return response


async def _serve(config: SimulatedModelConfig, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        loop.add_signal_handler(sig, done.set)
    try:
        server = SimulatedModelServer(config)
        url = await server.start(host, port)
        try:
            print(f"simulated model serving at {url}", flush=True)
            await done.wait()
        finally:
            await server.stop()
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)


def serve_forever(config: SimulatedModelConfig, host: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM, after printing ``simulated model serving at URL``."""
    asyncio.run(_serve(config, host, port))
