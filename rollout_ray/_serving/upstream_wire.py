"""The HTTP details every upstream call shares, whatever its route (Chat Completions, the
token-in routes): which failures are transient and the error a status becomes, ``Retry-After``,
the policy version a server stamps, SSE lines cut from network reads, and the reaping of a
request task whose call was cut."""

from __future__ import annotations

import asyncio
import email.utils
import math
import time
from collections.abc import AsyncIterator, Mapping

import aiohttp
import msgspec

from .._errors import OverlongPromptError, ProviderError

POLICY_HEADER = "X-Policy-Version"

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
_EXTENSION_FIELDS = ("return_token_ids", "return_prompt_token_ids", "return_tokens_as_token_ids")


class Transient(Exception):
    """An attempt failed in a way worth retrying; ``error`` is what to raise if not retried."""

    def __init__(self, error: ProviderError, retry_after: float | None = None, *, unreachable: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after
        self.unreachable = unreachable


def unreachable(url: str, error: BaseException) -> Transient:
    """A connection that failed before any answer came back (retried elsewhere)."""
    return Transient(
        ProviderError(f"cannot reach the model at {url}: {error or type(error).__name__}", 503), unreachable=True
    )


async def check_status(resp: aiohttp.ClientResponse) -> None:
    """Raise the provider's error for a failed answer: ``Transient`` for a transient status."""
    if resp.status >= 400:
        error = provider_error(resp.status, await resp.text(errors="replace"))
        if resp.status in TRANSIENT_STATUSES:
            raise Transient(error, retry_after(resp.headers))
        raise error


def reap(*tasks: asyncio.Future[None]) -> None:
    """Cancel those of ``tasks`` still running (a request whose call was cut: it would read on
    and fail when the client closes) and mark their end as seen, so that no "Task exception was
    never retrieved" is logged for an error nobody is left to handle."""
    for task in tasks:
        if task.cancel():
            task.add_done_callback(lambda t: t.cancelled() or t.exception())


def int_or_none(text: str | int | None) -> int | None:
    """A policy version as an integer; ``None`` when absent or not one (vLLM's ``"default"``)."""
    if text is None or isinstance(text, int):
        return text
    try:
        return int(text)
    except ValueError:
        return None


def refuses_extensions(error: ProviderError) -> bool:
    """Whether the provider refused a call for a token-capture field it does not know."""
    return error.status_code == 400 and any(name in str(error) for name in _EXTENSION_FIELDS)


def names(body: bytes, key: str) -> bool:
    """Whether ``body`` is a JSON object holding ``key``: an info route's answer."""
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return False
    return isinstance(value, dict) and key in value


def retry_after(headers: Mapping[str, str]) -> float | None:
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


def provider_error(status: int, text: str) -> ProviderError:
    detail = text[:1000]
    if status == 400 and any(p in text.lower() for p in _CONTEXT_PHRASES):
        return OverlongPromptError(f"provider rejected an overlong prompt: {detail}", status)
    return ProviderError(f"provider answered {status}: {detail}", status)


async def sse_data(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The payload of each ``data:`` line of an SSE answer, ``[DONE]`` included."""
    lines = LineSplitter()
    async for block in resp.content.iter_any():
        for line in lines.feed(block):
            line = line.strip()
            if line.startswith(b"data:"):
                yield line[5:].strip()
    for line in lines.end():
        line = line.strip()
        if line.startswith(b"data:"):
            yield line[5:].strip()


class LineSplitter:
    """Cuts network reads into lines. A stream has a line per token and two per event; one
    await per line (``async for line in resp.content``) cost more than the rest of the
    assembly, so what has arrived is split here. Linear in the bytes, however they arrive."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []

    def feed(self, block: bytes) -> list[bytes]:
        """The lines ``block`` completes (without their ``\\n``)."""
        head, newline, tail = block.rpartition(b"\n")
        if not newline:
            self._pending.append(block)
            return []
        self._pending.append(head)
        lines = b"".join(self._pending).split(b"\n")
        self._pending = [tail] if tail else []
        return lines

    def end(self) -> list[bytes]:
        """The last line, if the stream did not end with a newline."""
        rest, self._pending = b"".join(self._pending), []
        return [rest] if rest else []
