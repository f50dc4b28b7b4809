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
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from .._core.model import Model
from .._errors import OverlongPromptError, ProviderError, WireError
from .._record.messages import Request, Response
from .._record.wire import StreamAssembler, encode_request, parse_response

_CONTEXT_PHRASES = (
    "context length",
    "context_length",
    "maximum context",
    "context window",
    "prompt is too long",
    "too many tokens",
)
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
"""Provider statuses retried: rate limited, or the server (or a gateway) failed for now."""
_jitter = random.Random()


class _Transient(Exception):
    """An attempt failed in a way worth retrying; ``error`` is what to raise if not retried."""

    def __init__(self, error: ProviderError, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


class OpenAIModel(Model):
    """An OpenAI-compatible chat endpoint.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        name: the model name sent upstream (the rollout may force another).
        api_key: bearer token for the provider, if it needs one.
        timeout: seconds for one attempt of a request (connect, send, whole answer).
        stream: ask the provider to stream and assemble the chunks (lower time-to-first-byte
            on the provider side; the recorded turn is identical).
        max_connections: size of the keep-alive pool.
        retries: extra attempts after a transient failure (see the module docstring).
        backoff: seconds before the first retry, doubled for each further one, with jitter
            (each wait is drawn between half and all of it).
        max_backoff: cap on one wait. A ``Retry-After`` the provider sends is honoured up to
            this cap; one asking for longer ends the retries at once.

    A request takes at most ``(retries + 1) * timeout + retries * max_backoff`` seconds.
    """

    shareable = True

    def __init__(
        self,
        base_url: str,
        *,
        name: str | None = None,
        api_key: str | None = None,
        timeout: float = 600.0,
        stream: bool = False,
        max_connections: int = 1024,
        retries: int = 2,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
    ) -> None:
        if retries < 0:
            raise ValueError(f"`retries` must be >= 0, got {retries}")
        if not (backoff >= 0 and max_backoff >= 0):  # also rejects NaN
            raise ValueError(f"`backoff` and `max_backoff` must be >= 0, got {backoff} and {max_backoff}")
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self.base_url = base_url.rstrip("/")
        self.name = name
        self.timeout = timeout
        self.stream = stream
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The configuration travels, a live connection pool never does: a copy opens its own.
        return {**self.__dict__, "_session": None}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def complete(
        self, request: Request, *, model: str | None, sampling: dict[str, Any]
    ) -> Response:
        url = f"{self.base_url}/chat/completions"
        body = encode_request(request, sampling, model=model or self.name, stream=self.stream)
        attempt = 0
        while True:
            try:
                return await self._attempt(url, body)
            except _Transient as e:
                delay = self._delay(attempt, e.retry_after)
                if attempt >= self.retries or delay is None:
                    raise e.error from None
            attempt += 1
            await asyncio.sleep(delay)

    def _delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds before retry ``attempt + 1``; ``None``: the provider asks for too long."""
        if retry_after is not None:
            return retry_after if retry_after <= self.max_backoff else None
        return min(self.max_backoff, self.backoff * 2**attempt) * _jitter.uniform(0.5, 1.0)

    async def _attempt(self, url: str, body: bytes) -> Response:
        """One request; raises ``_Transient`` for a failure worth retrying."""
        try:
            async with asyncio.timeout(self.timeout):
                try:
                    resp = await self._client().post(url, data=body, headers=self._headers)
                except aiohttp.ClientError as e:  # refused, reset or closed before any answer
                    raise _Transient(ProviderError(f"cannot reach the model at {url}: {e}", 503)) from None
                async with resp:
                    if resp.status >= 400:
                        error = _provider_error(resp.status, await resp.text(errors="replace"))
                        if resp.status in TRANSIENT_STATUSES:
                            raise _Transient(error, _retry_after(resp.headers))
                        raise error
                    if self.stream:
                        return await _assemble(resp)
                    return parse_response(await resp.read())
        except TimeoutError:
            error = ProviderError(f"model request timed out after {self.timeout:g}s", 504)
            raise _Transient(error) from None
        except aiohttp.ClientError as e:  # the answer began, then broke off: final
            raise ProviderError(f"the model's answer from {url} was cut short: {e}", 502) from None
        except WireError as e:
            raise ProviderError(str(e), 502) from None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the provider asks us to wait (``Retry-After``: seconds or an HTTP date)."""
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return None if math.isnan(seconds) else max(0.0, seconds)


def _provider_error(status: int, text: str) -> ProviderError:
    detail = text[:1000]
    if status == 400 and any(p in text.lower() for p in _CONTEXT_PHRASES):
        return OverlongPromptError(f"provider rejected an overlong prompt: {detail}", status)
    return ProviderError(f"provider answered {status}: {detail}", status)


async def _assemble(resp: aiohttp.ClientResponse) -> Response:
    assembler = StreamAssembler()
    async for line in resp.content:
        line = line.strip()
        if line.startswith(b"data:"):
            assembler.feed(line[5:].strip())
            if assembler.done:
                break
    return assembler.response()
