"""Token capture's dialects: the request fields that ask a server for token ids and
log-probabilities (``extensions``), and, for ``token_capture="auto"``, which dialect a server
reads (``CaptureDialects``).

``"auto"``: each server is asked once, before its first call: ``GET /get_model_info``
answering 200 with a JSON object naming ``model_path`` is SGLang, else ``GET /version``
answering 200 with a JSON object naming ``version`` is vLLM, else the server is a plain
OpenAI-compatible one and its calls capture nothing (no field is added to them). The
bodies are checked so that a server answering every path (a web page) is not taken for
one that reads the extensions. Two GETs per server and process, never one per call; and
should a server so found refuse a call with 400 naming a capture field (a gateway whose
``/version`` is its own), the call is sent again without them, as are all later ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from .affinity import Server
from .upstream_wire import names, unreachable

__all__ = ["PROBE_TIMEOUT", "CaptureDialects", "extensions"]

PROBE_TIMEOUT = 10.0
"""Seconds for one dialect probe of ``token_capture="auto"``."""
_PROBES = (("/get_model_info", "sglang", "model_path"), ("/version", "vllm", "version"))
"""``token_capture="auto"``: the info route of each dialect, and a key its JSON answer holds."""


def extensions(dialect: str | None, sampling: Mapping[str, Any]) -> dict[str, Any] | None:
    """The request fields that ask ``dialect``'s server for token ids and log-probabilities."""
    if dialect == "vllm":
        if sampling.get("logprobs") is True:
            return {"return_token_ids": True, "logprobs": True}
        return {"return_token_ids": True, "logprobs": True, "return_tokens_as_token_ids": True}
    if dialect == "sglang":
        return {"return_token_ids": True, "return_prompt_token_ids": True, "logprobs": True}
    return None


class CaptureDialects:
    """``token_capture="auto"``: the dialect of each server, asked once per server and process
    (concurrent first calls wait for the one question)."""

    def __init__(self, client: Callable[[], aiohttp.ClientSession], headers: dict[str, str], timeout: float) -> None:
        self._client, self._headers, self._timeout = client, headers, timeout
        self._locks: dict[int, asyncio.Lock] = {}

    async def of(self, server: Server) -> str | None:
        """The capture dialect of ``server`` (``token_capture="auto"``): what it answers to."""
        if not server.detected:
            lock = self._locks.setdefault(id(server), asyncio.Lock())
            async with lock:
                if not server.detected:
                    server.dialect = await self._ask(server)
        return server.dialect

    async def _ask(self, server: Server) -> str | None:
        for route, dialect, key in _PROBES:
            try:
                async with asyncio.timeout(min(self._timeout, PROBE_TIMEOUT)):
                    async with self._client().get(server.root + route, headers=self._headers) as resp:
                        body = await resp.read()
            except (aiohttp.ClientError, TimeoutError) as e:
                raise unreachable(server.root, e) from None
            if resp.status == 200 and names(body, key):
                return dialect
        return None
