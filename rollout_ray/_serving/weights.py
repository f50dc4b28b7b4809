"""Loading a checkpoint into running model servers: the trainer's weight sync, in the block of
``Driver.paused(version=..., interrupt=True)``.

``reload_weights(model, checkpoint, version)`` loads ``checkpoint`` (a directory of the same
architecture and tokenizer) into every server of ``model`` in place, without a restart, and
labels it ``version``, in each server's dialect (``OpenAIModel.capture_dialect``; the
simulated model answers both):

* vLLM (``VLLM_SERVER_DEV_MODE=1``): ``POST /pause?mode=wait`` (lets what still runs finish,
  holds new requests and clears the prefix cache, whose entries the old weights computed;
  after an interrupting pause nothing runs there), ``POST /collective_rpc
  {"method": "reload_weights", "kwargs": {"weights_path": checkpoint}}``, ``POST
  /update_weight_version {"new_version": "<version>"}`` (what ``weight_versions`` report), then
  ``POST /resume``;
* SGLang: ``POST /update_weights_from_disk {"model_path": checkpoint, "weight_version":
  "<version>", "flush_cache": true}``.

Servers are loaded one after another; the first failure raises, so the block raises and the
run keeps the version it had (``Driver.paused``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import msgspec

from .._errors import ProviderError
from .affinity import Server
from .upstream import OpenAIModel

RELOAD_TIMEOUT = 600.0
"""Seconds for one server's reload (a large checkpoint reads for minutes)."""


async def reload_weights(model: OpenAIModel, checkpoint: str, version: int, *, timeout: float = RELOAD_TIMEOUT) -> None:
    """Load ``checkpoint`` into every server of ``model`` and label it ``version``.

    Raises:
        ProviderError: a server refused or failed a step (its status and answer), or its
            dialect is unknown (``token_capture`` None or a plain OpenAI server: 400).
    """
    headers = {k: v for k, v in model.headers.items() if k != "Content-Type"}
    async with aiohttp.ClientSession(headers=headers) as http:
        for server in model.pool.servers:
            dialect = server.dialect if server.detected else await model.capture_dialect()
            async with asyncio.timeout(timeout):
                if dialect == "vllm":
                    await _vllm(http, server, checkpoint, version)
                elif dialect == "sglang":
                    await _post(
                        http,
                        server,
                        "/update_weights_from_disk",
                        {"model_path": checkpoint, "weight_version": str(version), "flush_cache": True},
                    )
                else:
                    raise ProviderError(
                        f"cannot reload the weights of {server.root}: its dialect is unknown (give "
                        "OpenAIModel token_capture='vllm', 'sglang' or 'auto')",
                        400,
                    )


async def _vllm(http: aiohttp.ClientSession, server: Server, checkpoint: str, version: int) -> None:
    await _post(http, server, "/pause?mode=wait", None)
    try:
        await _post(
            http, server, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": checkpoint}}
        )
        await _post(http, server, "/update_weight_version", {"new_version": str(version)})
    finally:
        await _post(http, server, "/resume", None)


async def _post(http: aiohttp.ClientSession, server: Server, route: str, body: dict[str, Any] | None) -> None:
    url = server.root + route
    try:
        async with http.post(url, json=body) as resp:
            text = await resp.text(errors="replace")
    except aiohttp.ClientError as e:
        raise ProviderError(f"cannot reach the model at {url}: {e}", 503) from None
    if resp.status >= 400 or _refused(text):
        raise ProviderError(f"{url} answered {resp.status}: {text[:1000]}", resp.status if resp.status >= 400 else 502)


def _refused(text: str) -> bool:
    """Whether an answer of 200 says it failed (SGLang: ``{"success": false, ...}``)."""
    try:
        answer = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return False
    return isinstance(answer, dict) and answer.get("success") is False
