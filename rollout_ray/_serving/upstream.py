"""OpenAIModel: the upstream model over HTTP (vLLM, SGLang, any OpenAI-compatible API).

One keep-alive connection pool per model object; share the object between the rollouts of a
process (the interception does) so they share the pool. Every failure of the provider
becomes a ``ProviderError`` carrying the status the harness should see: the provider's own,
503 when it cannot be reached, 504 on timeout, 502 for a malformed answer.

Transient failures are retried here, with exponential backoff and jitter: a transient status
(429, 500, 502, 503, 504), a connection that failed before any answer came back, a timeout.
An answer that came back is never retried otherwise: a 200 whose body is malformed or cut
short, and every other error status, are final (retrying would sample the model again for
a turn it may already have answered). Only the last attempt's failure is raised.

Several servers: ``base_url`` may be a list; calls are routed per session (``affinity.py``)
and every request carries ``X-Session-ID: <trace id>``. A retry after a failure that took
a server out of rotation goes to another server at once, without a backoff.

Token capture (``token_capture``): the request asks the server for the prompt's and the
completion's token ids and the completion's log-probabilities, with the server's own request
extensions, and the ``Response`` carries them (``prompt_token_ids``, ``token_ids``,
``token_logprobs``) with the ``X-Policy-Version`` header (or SGLang's ``weight_version``):

* ``"vllm"``: ``return_token_ids`` and ``logprobs``, and ``return_tokens_as_token_ids`` when
  the harness did not ask for log-probabilities itself (so an older vLLM without
  ``return_token_ids`` still tells the ids, as ``token_id:N`` tokens). JSON and SSE.
* ``"sglang"``: ``return_token_ids``, ``return_prompt_token_ids`` and ``logprobs``. SGLang
  refuses token ids on a stream, so the call is made without streaming whatever ``stream``
  says (the harness's own stream is unaffected: the proxy synthesises it).
* ``"auto"``: each server is asked once which of the two it is, or neither
  (``capture_dialects.py``).

Token in, token out (``token_in``): a server with vLLM's scale-out routes (``vllm serve
--enable-scale-out``; the simulated model with ``scale_out=True``) is sent token ids, not text:
each turn's prompt is built on the ids the branch already has, and a call can be interrupted by
a weight update and continued from its partial output (``token_in.py``). ``"auto"`` (the
default) asks each vLLM-dialect server once whether it answers the render route. Other servers
get the Chat Completions route as below, and their calls cannot be interrupted: an
interrupting pause lets them finish (``_core/policy_gate``).

Every request carries ``X-Request-Id`` (a fresh id per request), which vLLM and SGLang name the
request by: what an abort names.

The harness still gets what it asked for: ``logprobs.content`` only if it asked
``logprobs: true`` (with its ``top_logprobs``); the capture's own fields never reach it.
With ``token_capture=None`` nothing is added to the request or read from the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import resource
import uuid
from collections.abc import Sequence
from typing import Any, Literal

import aiohttp
import msgspec

from .._core.model import SESSION_ID, CallContext, Interrupted, Model
from .._errors import ProviderError, WireError
from .._record.messages import Request, Response
from .._record.openai_codec import encode_request, parse_response
from .._record.openai_stream import StreamAssembler
from .affinity import Routing, Server, ServerPool
from .capture_dialects import CaptureDialects, extensions
from .server_load import LoadReader
from .token_in import Partial, TokenIn
from .upstream_wire import (
    POLICY_HEADER,
    LineSplitter,
    Transient,
    check_status,
    int_or_none,
    refuses_extensions,
    sse_data,
    unreachable,
)

__all__ = ["POLICY_HEADER", "LineSplitter", "OpenAIModel", "TokenCapture"]

TokenCapture = Literal["vllm", "sglang", "auto"]
SESSION_HEADER = "X-Session-ID"
_jitter = random.Random()  # noqa: S311 - retry jitter, not a secret


def _raise_open_files_limit() -> None:
    """One connection per call in flight: 10,000 calls need more than the usual 1,024 files."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        # Not allowed here: the soft limit stands, and a call beyond it fails as 503.
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class OpenAIModel(Model):
    """An OpenAI-compatible chat endpoint.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``, or a list of them (calls
            are spread over the servers and kept on one per session: ``affinity.py``).
        name: the model name sent upstream (the rollout may force another).
        api_key: bearer token for the provider, if it needs one.
        timeout: seconds for one attempt of a request (connect, send, whole answer).
        stream: ask the provider to stream and assemble the chunks (lower time-to-first-byte
            on the provider side; the recorded turn is identical).
        max_connections: size of the keep-alive pool; ``None`` (default): no bound of its own,
            the calls in flight (the driver's ``max_in_flight``) are the bound. The process's
            open-files limit is raised to its hard limit, as Ray does for its workers.
        retries: extra attempts after a transient failure (see the module docstring).
        backoff: seconds before the first retry, doubled for each further one, with jitter
            (each wait is drawn between half and all of it).
        max_backoff: cap on one wait. A ``Retry-After`` the provider sends is honoured up to
            this cap; one asking for longer ends the retries at once.
        token_capture: ``"vllm"``, ``"sglang"``, ``"auto"`` or ``None`` (off): which server's
            extensions ask for token ids and log-probabilities (see the module docstring).
        cooldown: seconds a failed server stays out of rotation (several servers).
        token_in: send token ids to a server with the scale-out routes (``"auto"``: those of
            the vLLM dialect that answer them; ``False``: never). Needs ``token_capture``.
        forward_fields: a harness's request fields to send upstream beyond the default list
            (``_core/sampling.FORWARDED_FIELDS``), e.g. ``{"top_k"}``.
        routing: how calls are spread over several servers: ``"affinity"`` (a session stays
            on its server, holding its prefix cache, unless that server is past
            ``1.25 x`` the mean load), ``"sticky"``, ``"least_loaded"``, ``"round_robin"``
            (``affinity.py``).

    A request takes at most ``(retries + 1) * timeout + retries * max_backoff`` seconds, plus
    one ``timeout`` per server that a failure takes out of rotation (the call moves on).
    """

    shareable = True

    def __init__(
        self,
        base_url: str | Sequence[str],
        *,
        name: str | None = None,
        api_key: str | None = None,
        timeout: float = 600.0,
        stream: bool = False,
        max_connections: int | None = None,
        retries: int = 2,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        token_capture: TokenCapture | None = None,
        cooldown: float = 10.0,
        token_in: bool | Literal["auto"] = "auto",
        forward_fields: Sequence[str] = (),
        routing: Routing = "affinity",
    ) -> None:
        if retries < 0:
            raise ValueError(f"`retries` must be >= 0, got {retries}")
        if not (backoff >= 0 and max_backoff >= 0):  # also rejects NaN
            raise ValueError(f"`backoff` and `max_backoff` must be >= 0, got {backoff} and {max_backoff}")
        if token_capture not in (None, "vllm", "sglang", "auto"):
            raise ValueError(f"`token_capture` must be 'vllm', 'sglang', 'auto' or None, got {token_capture!r}")
        if token_in not in (True, False, "auto"):
            raise ValueError(f"`token_in` must be True, False or 'auto', got {token_in!r}")
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self.pool = ServerPool(
            [base_url] if isinstance(base_url, str) else list(base_url), cooldown=cooldown, routing=routing
        )
        self._loads = LoadReader(self.pool)
        self.base_url = self.pool.servers[0].url
        self.token_capture = token_capture
        self.name = name
        self.timeout = timeout
        self.stream = stream
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self.token_in = token_in
        self.forward_fields = frozenset(forward_fields)
        self._token_in_at: dict[str, bool] = {}
        self._tokens = TokenIn(self._client, self._headers, timeout, stream)
        self._dialects = CaptureDialects(self._client, self._headers, timeout)

    def __getstate__(self) -> dict[str, Any]:
        # The configuration travels; a live connection pool and the routing state never do.
        return {
            **self.__dict__,
            "_session": None,
            "_dialects": None,
            "pool": self.pool.fresh(),
            "_token_in_at": {},
            "_tokens": None,
            "_loads": None,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._tokens = TokenIn(self._client, self._headers, self.timeout, self.stream)
        self._dialects = CaptureDialects(self._client, self._headers, self.timeout)
        self._loads = LoadReader(self.pool)

    @property
    def headers(self) -> dict[str, str]:
        """The headers of every request (its content type, the API key's authorization)."""
        return dict(self._headers)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            if self._max_connections is None:
                _raise_open_files_limit()
            connector = aiohttp.TCPConnector(limit=self._max_connections or 0, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Response:
        return await self.generate(request, model=model, sampling=sampling, call=CallContext())

    async def generate(
        self, request: Request, *, model: str | None, sampling: dict[str, Any], call: CallContext
    ) -> Response:
        n = sampling.get("n")
        if n is not None and n != 1:
            raise ProviderError(
                f"`n` must be 1, got {n!r}: a model call records one reply; send n requests for n replies", 400
            )
        return await self._call(request, model, sampling, call, None)

    async def resume(
        self,
        request: Request,
        interrupted: Interrupted,
        *,
        model: str | None,
        sampling: dict[str, Any],
        call: CallContext,
    ) -> Response:
        return await self._call(request, model, sampling, call, interrupted.state)

    async def _call(
        self, request: Request, model: str | None, sampling: dict[str, Any], call: CallContext, partial: Partial | None
    ) -> Response:
        session = SESSION_ID.get()
        headers = self._headers if session is None else {**self._headers, SESSION_HEADER: session}
        auto = self.token_capture == "auto"
        dialect: str | None = self.token_capture
        attempt = 0
        if self.pool.routing in ("affinity", "least_loaded"):
            await self._loads.refresh(self._client())
        while True:
            server = self.pool.pick(session)
            try:
                if auto:  # servers of one model may differ; each is asked once
                    dialect = await self._dialects.of(server)
                if partial is not None or await self._takes_ids(server, dialect, model):
                    if call.interrupt is not None:
                        # from here the call can be stopped and continued: an interrupt that
                        # fires while its prompt is built stops it before it is sent
                        call.interrupt.arm()
                    chat = msgspec.json.decode(
                        encode_request(request, sampling, model=model or self.name, stream=False)
                    )
                    if partial is None:
                        partial = await self._tokens.start(server, chat, call)
                    wants = sampling.get("logprobs") is True
                    response = await self._tokens.continue_(server, chat, partial, call, wants)
                else:
                    if call.interrupt is not None:
                        call.interrupt.cannot_continue()
                    body = self._body(request, model, sampling, dialect)
                    response = await self._attempt(
                        server, body, {**headers, "X-Request-Id": uuid.uuid4().hex}, dialect, sampling
                    )
                self.pool.succeeded(server)
                return response
            except Transient as e:
                if self.pool.failed(server, unreachable=e.unreachable):
                    continue  # that server is out, another is in: move on at once, as a fresh try
                delay = self._delay(attempt, e.retry_after)
                if attempt >= self.retries or delay is None:
                    raise e.error from None
            except ProviderError as e:
                if not (auto and dialect is not None and refuses_extensions(e)):
                    raise
                server.dialect = None  # its info route misled: it reads no capture field, ask none again
                continue
            attempt += 1
            await asyncio.sleep(delay)

    async def _takes_ids(self, server: Server, dialect: str | None, model: str | None) -> bool:
        """Whether calls to ``server`` go as token ids (``token_in``)."""
        if dialect != "vllm" or self.token_in is False:
            return False
        if self.token_in is True:
            return True
        known = self._token_in_at.get(server.url)
        if known is None:
            known = self._token_in_at[server.url] = await self._tokens.supported(server, model or self.name)
        return known

    def _body(self, request: Request, model: str | None, sampling: dict[str, Any], dialect: str | None) -> bytes:
        return encode_request(
            request,
            sampling,
            model=model or self.name,
            stream=self._streams(dialect),
            extensions=extensions(dialect, sampling),
        )

    def _streams(self, dialect: str | None) -> bool:
        return self.stream and dialect != "sglang"  # SGLang refuses token ids on a stream

    async def capture_dialect(self) -> str | None:
        """The dialect whose extensions the calls to the first server carry: ``token_capture``
        itself, or for ``"auto"`` what that server answered (asked once, as its first call
        asks); ``None``: nothing is captured.

        Raises:
            ProviderError: ``"auto"``, and the server could not be asked (503).
        """
        if self.token_capture != "auto":
            return self.token_capture
        try:
            return await self._dialects.of(self.pool.servers[0])
        except Transient as e:
            raise e.error from None

    def _delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds before retry ``attempt + 1``; ``None``: the provider asks for too long."""
        if retry_after is not None:
            return retry_after if retry_after <= self.max_backoff else None
        return min(self.max_backoff, self.backoff * 2**attempt) * _jitter.uniform(0.5, 1.0)  # type: ignore[no-any-return]

    async def _attempt(
        self, server: Server, body: bytes, headers: dict[str, str], dialect: str | None, sampling: dict[str, Any]
    ) -> Response:
        """One request; raises ``Transient`` for a failure worth retrying."""
        url = server.chat_url
        server.inflight += 1
        try:
            async with asyncio.timeout(self.timeout):
                try:
                    resp = await self._client().post(url, data=body, headers=headers)
                except aiohttp.ClientError as e:  # refused, reset or closed before any answer
                    raise unreachable(url, e) from None
                async with resp:
                    await check_status(resp)
                    capture = dialect is not None
                    wants = sampling.get("logprobs") is True
                    if self._streams(dialect):
                        response = await _assemble(resp, capture, wants)
                    else:
                        response = parse_response(await resp.read(), capture=capture, logprobs=wants)
                    version = resp.headers.get(POLICY_HEADER)
                    if version is not None:
                        response.policy_version = int_or_none(version)
                    return response
        except TimeoutError:
            raise Transient(ProviderError(f"model request timed out after {self.timeout:g}s", 504)) from None
        except aiohttp.ClientError as e:  # the answer began, then broke off: final
            raise ProviderError(f"the model's answer from {url} was cut short: {e}", 502) from None
        except WireError as e:
            raise ProviderError(str(e), 502) from None
        finally:
            server.inflight -= 1

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _assemble(resp: aiohttp.ClientResponse, capture: bool, logprobs: bool) -> Response:
    assembler = StreamAssembler(capture=capture, logprobs=logprobs)
    async for data in sse_data(resp):
        assembler.feed(data)
        if assembler.done:
            break
    return assembler.response()
