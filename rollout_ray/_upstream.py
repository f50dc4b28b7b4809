"""OpenAIModel: the upstream model over HTTP (vLLM, SGLang, any OpenAI-compatible API).

One keep-alive connection pool per model object; share the object between the rollouts of a
process (the interception does) so they share the pool. Every failure of the provider
becomes a ``ProviderError`` carrying the status the harness should see: the provider's own,
503 when it cannot be reached, 504 on timeout, 502 for a malformed answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from ._errors import OverlongPromptError, ProviderError
from ._messages import Request, Response
from ._model import Model
from ._openai import StreamAssembler, WireError, encode_request, parse_response

_CONTEXT_PHRASES = (
    "context length",
    "context_length",
    "maximum context",
    "context window",
    "prompt is too long",
    "too many tokens",
)


class OpenAIModel(Model):
    """An OpenAI-compatible chat endpoint.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        name: the model name sent upstream (the rollout may force another).
        api_key: bearer token for the provider, if it needs one.
        timeout: seconds for one whole request.
        stream: ask the provider to stream and assemble the chunks (lower time-to-first-byte
            on the provider side; the recorded turn is identical).
        max_connections: size of the keep-alive pool.
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
    ) -> None:
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
        try:
            async with asyncio.timeout(self.timeout):
                async with self._client().post(url, data=body, headers=self._headers) as resp:
                    if resp.status >= 400:
                        raise _provider_error(resp.status, await resp.text(errors="replace"))
                    if self.stream:
                        return await _assemble(resp)
                    return parse_response(await resp.read())
        except TimeoutError:
            raise ProviderError(f"model request timed out after {self.timeout:g}s", 504) from None
        except aiohttp.ClientError as e:
            raise ProviderError(f"cannot reach the model at {url}: {e}", 503) from None
        except WireError as e:
            raise ProviderError(str(e), 502) from None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


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
