"""The built-in simulated model: a deterministic, OpenAI-compatible chat completions server.

Routes: ``POST /v1/chat/completions`` (JSON and SSE; ``n`` choices; token capture in the
vLLM and SGLang shapes, ``dialects.py``), ``GET /v1/models``, ``GET /health``, the info
route of ``config.dialect`` so a client can tell the dialect (vLLM: ``GET /version`` →
``{"version": ...}``; SGLang: ``GET /model_info`` and its older name ``/get_model_info``,
with ``weight_version``), and, for tests and benchmarks only, ``POST /admin/policy_version``
``{"version": N}`` which sets :attr:`SimulatedModelServer.policy_version`. Every response
carries ``X-Policy-Version``: for a chat completion, the version when it arrived.

Determinism: every chat completion is keyed by ``blake2b(seed, messages)``, where
``messages`` is the request's ``messages`` array re-encoded as compact JSON (key order as
sent). The server counts how often it has seen each key; the n-th request with a key
(n = 0, 1, ...) draws its fault, its error draw and its completion id from
``blake2b(key, n)``. So the same config and the same requests give the same answers and
faults whatever order concurrent requests arrive in, and a retry of a failed request gets
fresh draws (temperature and ``seed``: ``completion.py``). Keys are kept for the server's
life (16 bytes plus a count each).

Latency: an answer waits ``ttft + per_token * tokens``, ``tokens`` being the longest
choice's completion tokens; streamed, the waits are spread over the chunks (one chunk per
token with token capture, four pieces of text without).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from .answers import prompt_tokens
from .completion import Choice, Draw, choose
from .config import SimulatedModelConfig
from .dialects import Event, sglang_completion, sglang_events, vllm_completion, vllm_events
from .request import ChatCall, Invalid, parse
from .template import render

__all__ = ["SimulatedModelConfig", "SimulatedModelServer", "SimulatedModelStats", "serve_forever"]

FAULTS = ("429", "5xx", "timeout", "malformed")
SERVER_ERRORS = (500, 502, 503)
STREAM_PIECES = 4
POLICY_HEADER = "X-Policy-Version"
VLLM_VERSION = "0.32.0+simulated"
"""What ``GET /version`` says: the vLLM release whose shapes are emulated."""
# Long enough for in-flight answers to finish, short enough that stop() never hangs.
SHUTDOWN_TIMEOUT = 1.0
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


@dataclass
class SimulatedModelStats:
    """Counts of chat completion requests (other routes are not counted)."""

    requests: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    by_fault: Counter[str] = field(default_factory=Counter)


def _pieces(text: str) -> list[str]:
    size = max(1, -(-len(text) // STREAM_PIECES))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _json(status: int, payload: Any) -> web.Response:
    return web.Response(status=status, body=_encode(payload), content_type="application/json")


class SimulatedModelServer:
    """An aiohttp server for one :class:`SimulatedModelConfig`; ``async with`` starts it on
    127.0.0.1 with a free port (unless already started) and stops it.

    ``policy_version`` (an int, from ``config.policy_version``) is what the
    ``X-Policy-Version`` header says; set it, or ``POST /admin/policy_version``, to bump it.
    """

    def __init__(self, config: SimulatedModelConfig | None = None) -> None:
        self.config = config or SimulatedModelConfig()
        self.stats = SimulatedModelStats()
        self.base_url: str | None = None
        self.policy_version = self.config.policy_version
        self._seen: dict[bytes, int] = {}
        self._seed = f"{self.config.seed}\0".encode()
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)
        app.router.add_post("/admin/policy_version", self._set_policy_version)
        if self.config.dialect == "vllm":
            app.router.add_get("/version", self._version)
        else:
            app.router.add_get("/model_info", self._model_info)
            app.router.add_get("/get_model_info", self._model_info)
        app.on_response_prepare.append(self._stamp)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Bind and serve; returns the base URL ``http://HOST:PORT/v1``."""
        if self._runner is not None:
            raise RuntimeError("SimulatedModelServer is already started")
        runner = web.AppRunner(self._app(), access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
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

    async def _stamp(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers.setdefault(POLICY_HEADER, str(self.policy_version))

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": self.config.model_name, "object": "model", "owned_by": "rollout_ray"}]
        return _json(200, {"object": "list", "data": data})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _version(self, request: web.Request) -> web.Response:
        return _json(200, {"version": VLLM_VERSION})

    async def _model_info(self, request: web.Request) -> web.Response:
        name = self.config.model_name
        return _json(200, {
            "model_path": name, "tokenizer_path": name, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": str(self.policy_version),
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": "simulated", "architectures": ["SimulatedForCausalLM"],
        })

    async def _set_policy_version(self, request: web.Request) -> web.Response:
        try:
            body = _decode(await request.read())
        except msgspec.DecodeError:
            body = None
        version = body.get("version") if isinstance(body, dict) else None
        if type(version) is not int or version < 0:
            error = {"message": "'version' must be a non-negative integer.", "type": "invalid_request_error",
                     "param": "version", "code": None}
            return _json(400, {"error": error})
        self.policy_version = version
        return _json(200, {"version": version})

    def _reply(self, status: int, payload: bytes, version: int | None = None) -> web.Response:
        self.stats.by_status[status] += 1
        response = web.Response(status=status, body=payload, content_type="application/json")
        if version is not None:
            response.headers[POLICY_HEADER] = str(version)
        return response

    def _error(self, status: int, message: str, kind: str, param: str | None = None,
               code: str | None = None) -> web.Response:
        """An OpenAI-style error body: ``{"error": {message, type, param, code}}``."""
        error = {"message": message, "type": kind, "param": param, "code": code}
        return self._reply(status, _encode({"error": error}))

    def _invalid(self, exc: Invalid) -> web.Response:
        if exc.sglang:
            flat = {"object": "error", "message": str(exc), "type": "BadRequest", "param": None, "code": 400}
            return self._reply(400, _encode(flat))
        return self._error(400, str(exc), "invalid_request_error", exc.param)

    def _draw(self, messages: list[Any]) -> tuple[str | None, int, str, Draw]:
        """``(fault, 5xx status, completion id, draws)`` for this request."""
        key = hashlib.blake2b(self._seed + _encode(messages), digest_size=16).digest()
        attempt = self._seen.get(key, 0)
        self._seen[key] = attempt + 1
        d = hashlib.blake2b(key + attempt.to_bytes(8, "big"), digest_size=28).digest()
        u_fault = int.from_bytes(d[:8], "big") / 2**64
        cfg, fault, edge = self.config, None, 0.0
        rates = (cfg.rate_429, cfg.rate_5xx, cfg.rate_timeout, cfg.rate_malformed)
        for name, rate in zip(FAULTS, rates):
            edge += rate
            if u_fault < edge:
                fault = name
                break
        return fault, SERVER_ERRORS[(key[0] + attempt) % 3], "chatcmpl-" + d[16:].hex(), Draw(key, d)

    async def _fault(self, fault: str, status_5xx: int) -> web.Response:
        """The error answer of a 429, 5xx or timeout fault (a timeout holds the request first)."""
        self.stats.by_fault[fault] += 1
        if fault == "429":
            message, code = "Rate limit reached (simulated).", "rate_limit_exceeded"
            return self._error(429, message, "rate_limit_error", code=code)
        if fault == "5xx":
            return self._error(status_5xx, "The server had an error (simulated).", "server_error")
        try:
            await asyncio.wait_for(self._stopping.wait(), self.config.timeout_hold)
        except TimeoutError:
            pass
        return self._error(504, "Upstream timed out (simulated).", "timeout")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.stats.requests += 1
        version = self.policy_version
        try:
            call = parse(await request.read(), self.config)
        except Invalid as exc:
            return self._invalid(exc)
        fault, status_5xx, cid, draw = self._draw(call.messages)
        if fault in ("429", "5xx", "timeout"):
            return await self._fault(fault, status_5xx)
        if fault is not None:
            self.stats.by_fault[fault] += 1
        choices = [choose(call, self.config, draw, i) for i in range(call.n)]
        head = {"id": cid, "created": int(time.time()), "model": self.config.model_name}
        latency = self.config.ttft + self.config.per_token * max(c.tokens for c in choices)
        if call.stream:
            events = self._events(call, head, choices, version)
            return await self._stream(request, events, fault == "malformed", version)
        if latency > 0:
            await asyncio.sleep(latency)
        payload = _encode(self._completion(call, head, choices, version, latency))
        if fault == "malformed":
            payload = payload[: len(payload) // 2]
        return self._reply(200, payload, version)

    def _usage(self, call: ChatCall, choices: list[Choice], prompt: list[int]) -> dict[str, int]:
        tokens = len(prompt) if call.capture.on else prompt_tokens(call.messages)
        completion = sum(c.tokens for c in choices)
        return {"prompt_tokens": tokens, "completion_tokens": completion, "total_tokens": tokens + completion}

    def _prompt(self, call: ChatCall) -> list[int]:
        return render(call.messages, call.tools, drift=self.config.template_drift) if call.capture.on else []

    def _completion(self, call: ChatCall, head: dict[str, Any], choices: list[Choice], version: int,
                    latency: float) -> dict[str, Any]:
        prompt = self._prompt(call)
        usage = self._usage(call, choices, prompt)
        if call.capture.on and call.capture.dialect == "vllm":
            return vllm_completion(head, choices, prompt, usage, call.capture)
        if call.capture.on:
            return sglang_completion(head, choices, prompt, usage, call.capture, version, latency)
        out = [{"index": c.index, "message": c.message, "logprobs": None, "finish_reason": c.finish}
               for c in choices]
        return {**head, "object": "chat.completion", "choices": out, "usage": usage}

    def _events(self, call: ChatCall, head: dict[str, Any], choices: list[Choice], version: int) -> list[Event]:
        prompt = self._prompt(call)
        usage = self._usage(call, choices, prompt) if call.include_usage else None
        cfg = self.config
        if call.capture.on and call.capture.dialect == "vllm":
            return vllm_events(head, choices, prompt, usage, call.capture, cfg.ttft, cfg.per_token)
        if call.capture.on:
            return sglang_events(head, choices, usage, call.capture, cfg.ttft, cfg.per_token)
        return self._plain_events(head, choices, usage)

    def _plain_events(self, head: dict[str, Any], choices: list[Choice], usage: dict[str, int] | None) -> list[Event]:
        """The plain (no token capture) chunks: for each choice a role chunk, a tool call's
        opening, four pieces of text or arguments, a finish chunk; choices side by side."""
        head = {**head, "object": "chat.completion.chunk"}
        if usage is not None:
            head["usage"] = None
        per_choice = [self._choice_events(head, c) for c in choices]
        events: list[Event] = []
        for step in itertools.zip_longest(*per_choice):
            present = [e for e in step if e is not None]
            wait = max(w for w, _ in present)
            events += [(wait if i == 0 else 0.0, chunk) for i, (_, chunk) in enumerate(present)]
        if usage is not None:
            events.append((0.0, {**head, "choices": [], "usage": usage}))
        return events

    def _choice_events(self, head: dict[str, Any], c: Choice) -> list[Event]:
        """One choice's plain chunks; the waits add up to ``ttft + per_token * tokens``."""

        def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
            return {**head, "choices": [{"index": c.index, "delta": delta, "logprobs": None, "finish_reason": reason}]}

        events: list[Event] = [(self.config.ttft, chunk({"role": "assistant", "content": ""}))]
        calls = c.message.get("tool_calls")
        if calls:
            call, fn = calls[0], calls[0]["function"]
            opening = {"index": 0, "id": call["id"], "type": "function"}
            opening["function"] = {"name": fn["name"], "arguments": ""}
            events.append((0.0, chunk({"tool_calls": [opening]})))
            text = fn["arguments"]
        else:
            text = c.message["content"]
        per_char = self.config.per_token * c.tokens / max(1, len(text))
        for piece in _pieces(text):
            if calls:
                delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
            else:
                delta = {"content": piece}
            events.append((per_char * len(piece), chunk(delta)))
        events.append((0.0, chunk({}, c.finish)))
        return events

    async def _stream(self, request: web.Request, events: list[Event], malformed: bool,
                      version: int) -> web.StreamResponse:
        """Send ``events`` as SSE, then ``[DONE]``; malformed: cut short in the second event."""
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", POLICY_HEADER: str(version)}
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
