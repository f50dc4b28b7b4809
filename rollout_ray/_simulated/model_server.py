"""The built-in simulated model: a deterministic, OpenAI-compatible chat completions server.

Routes: ``POST /v1/chat/completions`` (JSON and SSE; ``n`` choices; token capture in the
vLLM and SGLang shapes, ``dialects.py``; the answer once admitted: ``chat_answer.py``), ``GET /v1/models``, ``GET /health``, the info
route of ``config.dialect`` so a client can tell the dialect (vLLM: ``GET /version`` →
``{"version": ...}``; SGLang: ``GET /model_info`` and its older name ``/get_model_info``,
with ``weight_version``), the dialect's interrupt and weight routes (``weight_routes.py``) and its
token-in route (``generate.py``), and, for tests and benchmarks only,
``POST /admin/policy_version`` ``{"version": N}`` which sets
:attr:`SimulatedModelServer.policy_version`. Every response carries ``X-Policy-Version``: the
version when it starts (a JSON answer: when its last token was produced; a stream: when it was
admitted).

Determinism: ``request_draws.py`` (faults, error draws and ids per request key; what the model
samples from per conversation) and ``completion.py`` (temperature and ``seed``).

``GET /metrics``: vLLM's gauges and counters, of the capacity model (``config.capacity``:
batching, waiting queue, KV and prefix cache, ``batcher.py``) when it is on.

Time: a request that arrives while the engine is paused waits for the resume
(``engine_state.py``); then its tokens are produced on the engine's clock, token ``j`` at
``ttft + per_token * (j + 1)``, each under the policy version of its moment
(``decoding.py``); a stream sends each token when it is produced. An abort (``weight_routes.py``)
ends a generation with ``finish_reason: "abort"`` and what it produced so far; a closed
connection ends it at once. Without token capture an answer is fixed when it is admitted: it
waits ``ttft + per_token * tokens`` (the longest choice's estimate), or streams four pieces of
text per choice over that time.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from .batcher import Batcher, metrics_route
from .chat_answer import captured_answer, plain_answer
from .completion import Choice, Draw, choose
from .config import SimulatedModelConfig
from .decoding import Decoder, Token, produce
from .engine_state import Engine, Flight
from .generate import add_token_routes
from .rendering import add_rendering_routes
from .request import ChatCall, Invalid, parse
from .request_draws import Attempts
from .served import POLICY_HEADER
from .template import render
from .weight_routes import add_control_routes

__all__ = ["SimulatedModelConfig", "SimulatedModelServer", "SimulatedModelStats"]

VLLM_VERSION = "0.32.0+simulated"
"""What ``GET /version`` says: the vLLM release whose shapes are emulated."""
# Long enough for in-flight answers to finish, short enough that stop() never hangs.
SHUTDOWN_TIMEOUT = 1.0
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


@dataclass
class SimulatedModelStats:
    """Counts of generation requests (chat completions and the token-in routes; other routes
    are not counted), of the completion tokens produced with token capture, and of the
    generations an abort or a closed connection ended."""

    requests: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    by_fault: Counter[str] = field(default_factory=Counter)
    tokens: int = 0
    aborted: int = 0


def _json(status: int, payload: Any) -> web.Response:
    return web.Response(status=status, body=_encode(payload), content_type="application/json")


class SimulatedModelServer:
    """An aiohttp server for one :class:`SimulatedModelConfig`; ``async with`` starts it on
    127.0.0.1 with a free port (unless already started) and stops it.

    ``policy_version`` (an int, from ``config.policy_version``) is the model's weights: what
    ``X-Policy-Version`` says and what tokens are produced under; set it, or
    ``POST /admin/policy_version``, or the dialect's weight routes, to load another.
    """

    def __init__(self, config: SimulatedModelConfig | None = None) -> None:
        self.config = config or SimulatedModelConfig()
        self.stats = SimulatedModelStats()
        self.base_url: str | None = None
        self.engine = Engine(self.config.policy_version)
        self.attempts = Attempts(self.config)
        capacity = self.config.capacity
        self.batcher = None if capacity is None else Batcher(capacity, self.engine)
        # With the capacity model its steps time every generation: nothing is added per request.
        self.ttft, self.per_token = (0.0, 0.0) if capacity else (self.config.ttft, self.config.per_token)
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()

    @property
    def policy_version(self) -> int:
        return self.engine.version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        self.engine.set_version(version)

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", metrics_route(self.config.model_name, self.engine, self.batcher))
        app.router.add_post("/admin/policy_version", self._set_policy_version)
        if self.config.dialect == "vllm":
            app.router.add_get("/version", self._version)
            add_rendering_routes(app, self)
        else:
            app.router.add_get("/model_info", self._model_info)
            app.router.add_get("/get_model_info", self._model_info)
        add_control_routes(app, self)
        add_token_routes(app, self)
        app.on_response_prepare.append(self._stamp)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Bind and serve; returns the base URL ``http://HOST:PORT/v1``."""
        if self._runner is not None:
            raise RuntimeError("SimulatedModelServer is already started")
        # handler_cancellation: a client that closes its connection stops its generation at once.
        runner = web.AppRunner(
            self._app(), access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT, handler_cancellation=True
        )
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
        """Release held and paused requests, close every connection and the socket. Idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            self._stopping.set()
            self.engine.shutdown()
            await runner.cleanup()
            if self.batcher is not None:
                await self.batcher.stop()

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
        return _json(
            200,
            {
                "model_path": name,
                "tokenizer_path": name,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": str(self.policy_version),
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "simulated",
                "architectures": ["SimulatedForCausalLM"],
            },
        )

    async def _set_policy_version(self, request: web.Request) -> web.Response:
        try:
            body = _decode(await request.read())
        except msgspec.DecodeError:
            body = None
        version = body.get("version") if isinstance(body, dict) else None
        if type(version) is not int or version < 0:
            error = {
                "message": "'version' must be a non-negative integer.",
                "type": "invalid_request_error",
                "param": "version",
                "code": None,
            }
            return _json(400, {"error": error})
        self.policy_version = version
        return _json(200, {"version": version})

    def reply(self, status: int, payload: bytes, version: int | None = None) -> web.Response:
        self.stats.by_status[status] += 1
        response = web.Response(status=status, body=payload, content_type="application/json")
        if version is not None:
            response.headers[POLICY_HEADER] = str(version)
        return response

    def _error(
        self, status: int, message: str, kind: str, param: str | None = None, code: str | None = None
    ) -> web.Response:
        """An OpenAI-style error body: ``{"error": {message, type, param, code}}``."""
        error = {"message": message, "type": kind, "param": param, "code": code}
        return self.reply(status, _encode({"error": error}))

    def _invalid(self, exc: Invalid) -> web.Response:
        if exc.sglang:
            flat = {"object": "error", "message": str(exc), "type": "BadRequest", "param": None, "code": 400}
            return self.reply(400, _encode(flat))
        return self._error(400, str(exc), "invalid_request_error", exc.param)

    async def _fault(self, fault: str, status_5xx: int) -> web.Response:
        """The error answer of a 429, 5xx or timeout fault (a timeout holds the request first)."""
        self.stats.by_fault[fault] += 1
        if fault == "429":
            message, code = "Rate limit reached (simulated).", "rate_limit_exceeded"
            return self._error(429, message, "rate_limit_error", code=code)
        if fault == "5xx":
            return self._error(status_5xx, "The server had an error (simulated).", "server_error")
        with suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), self.config.timeout_hold)
        return self._error(504, "Upstream timed out (simulated).", "timeout")

    def _request_id(self, request: web.Request, given: str | None, cid: str) -> str:
        """What an abort names a chat completion by: vLLM's ``chatcmpl-`` + the client's
        ``X-Request-Id`` or ``request_id``, SGLang's ``rid``; else its completion id."""
        given = request.headers.get("X-Request-Id") or given
        if given is None:
            return cid
        return f"chatcmpl-{given}" if self.config.dialect == "vllm" else given

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.stats.requests += 1
        try:
            call = parse(await request.read(), self.config)
        except Invalid as exc:
            return self._invalid(exc)
        prompt = render(call.messages, call.tools, drift=self.config.template_drift)
        attempt = self.attempts.next(_encode(call.messages), self.attempts.conversation(prompt))
        if attempt.fault in ("429", "5xx", "timeout"):
            return await self._fault(attempt.fault, attempt.status_5xx)
        if attempt.fault is not None:
            self.stats.by_fault[attempt.fault] += 1
        rid = self._request_id(request, call.request_id, attempt.cid)
        await self.engine.admit()
        with self.flight(rid) as flight:
            head = {
                "id": rid if self.config.dialect == "vllm" else attempt.cid,
                "created": int(time.time()),
                "model": self.config.model_name,
            }
            if call.capture.on:
                return await captured_answer(self, request, call, head, attempt, prompt, flight)
            return await plain_answer(self, request, call, head, attempt, flight, prompt)

    def plan(self, call: ChatCall, draw: Draw, index: int, version: int) -> Choice:
        """Choice ``index`` of ``call`` as the model at ``version`` writes it whole (unscored:
        its tokens are scored as they are produced)."""
        return choose(call, self.config, draw, index, version, scored=False)

    @contextmanager
    def flight(self, rid: str) -> Iterator[Flight]:
        """A generation in flight under request id ``rid``, counted in ``stats.aborted`` if an
        abort or the client (its connection closed, so aiohttp cancels the handler) ends it."""
        with self.engine.flight(rid) as flight:
            try:
                yield flight
            except asyncio.CancelledError:
                self.stats.aborted += 1
                raise
            if flight.aborted and not flight.cut:
                self.stats.aborted += 1

    async def run(self, flight: Flight, decoders: list[Decoder], emit: Any = None, prompt: Sequence[int] = ()) -> bool:
        """Decode ``decoders`` on the engine's clock (``decoding.produce``), counting the tokens;
        ``emit``: a stream's writer. ``False``: aborted. With the capacity model, the batch
        produces each choice (after ``prompt``, and a continued completion's ids so far) first,
        then the tokens go out at once, all under the version of its admission."""
        try:
            if self.batcher is not None:
                version = self.engine.version
                done = await self.batcher.serve(
                    flight, [*prompt, *decoders[0].ids], [d.plan(version).ids[len(d.ids) :] for d in decoders]
                )
                if not done:
                    for d in decoders:
                        d.abort()
                    return False
            return await produce(
                self.engine, flight, decoders, self.ttft, self.per_token, emit or _nothing, stream=emit is not None
            )
        finally:
            self.stats.tokens += sum(len(d.ids) - d.start for d in decoders)


async def _nothing(tokens: list[Token]) -> None:
    return None
