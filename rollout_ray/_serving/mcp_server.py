"""A rollout's toolset as an MCP server: streamable HTTP, stateless, JSON answers.

The ``ToolServer`` routes ``POST {base}/mcp/{server}`` (the rollout's token as
``Authorization: Bearer``) and ``POST {tool url}/mcp`` (the token in the path, for clients
that cannot set a header) here, so an agent that speaks MCP (any ``mcp`` client, Claude
Code, Codex) uses the task's tools unchanged. Both eras of the protocol are answered:

* the handshake era (``initialize``, then requests carrying ``mcp-protocol-version``);
* the stateless era (2026-07-28: ``server/discover``, every request carrying its version and
  capabilities in ``params._meta``).

No session is kept (no ``Mcp-Session-Id``): every request stands alone, so one server serves
many rollouts and a restarted client needs nothing back. There is no server-to-client
stream (``GET`` is 405): our tools neither notify nor ask the client anything.

Methods: ``initialize``, ``server/discover``, ``ping``, ``tools/list``, ``tools/call``. A
call runs through ``call_tool`` as the native route's do (same timeout, same record on
``trace.tool_calls``); its answer is a ``CallToolResult``: ``content`` (one text block) and
``structuredContent`` when the tool returned data, ``isError`` when it raised, timed out or
got bad arguments (the model sees those, as the spec asks). An unknown tool is the JSON-RPC
error -32602; the rollout's runtime gone is -32603 with HTTP 503, as the native route.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web

from .._core.runtime import Runtime
from .._core.tools import ToolOutcome, call_tool
from .._core.toolset import Toolset
from .._errors import InfrastructureLost, SandboxError, ToolInputError, ToolServerError
from .._record.trace import ToolCallRecord

HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
"""Revisions negotiated by ``initialize``; the newest is offered to a client asking another."""

MODERN_VERSIONS = ("2026-07-28",)
"""Revisions whose requests each carry their version (``server/discover``, no handshake)."""

VERSION_META = "io.modelcontextprotocol/protocolVersion"
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603
UNSUPPORTED_PROTOCOL_VERSION = -32022

_SERVER_VERSION = "1"
_UNCACHED = {"cacheScope": "private", "ttlMs": 0}
"""The stateless era's cache hints on cacheable results: a rollout's tools are its own."""
_CAPABILITIES = {"tools": {"listChanged": False}}


def rpc_error(
    status: int, code: int, message: str, id: Any = None, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON-RPC error answer with HTTP ``status`` (200 for errors the protocol carries)."""
    body = {"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}
    return web.json_response(body, status=status, headers=headers)


def _result(id: Any, result: dict[str, Any], modern: bool, server: str) -> web.Response:
    if modern:  # the stateless era's results say they are complete and who answered
        result = {**result, "resultType": "complete", "_meta": {SERVER_INFO_META: _info(server)}}
    return web.json_response({"jsonrpc": "2.0", "id": id, "result": result})


def _info(server: str) -> dict[str, str]:
    return {"name": server, "version": _SERVER_VERSION}


def tool_list(toolset: Toolset) -> list[dict[str, Any]]:
    """The toolset's tools as MCP ``Tool`` objects."""
    return [
        {"name": t.name, "description": t.description, "inputSchema": {"type": "object", **t.parameters}}
        for t in toolset.specs()
    ]


def call_result(outcome: ToolOutcome) -> dict[str, Any]:
    """``outcome`` as an MCP ``CallToolResult``."""
    result: dict[str, Any] = {
        "content": [{"type": "text", "text": outcome.content}],
        "isError": outcome.error is not None,
    }
    if outcome.data and outcome.error is None:  # always an object: a non-object is wrapped
        value = msgspec.json.decode(outcome.content)
        result["structuredContent"] = value if isinstance(value, dict) else {"result": value}
    return result


async def answer(
    body: bytes,
    header_version: str | None,
    toolset: Toolset,
    runtime: Runtime | None,
    *,
    timeout: float,
    on_call: Callable[[ToolCallRecord], None] | None,
    on_error: Callable[[ToolServerError], None] | None = None,
) -> web.Response:
    """The answer to one POSTed JSON-RPC message for ``toolset``; ``on_error`` gets the
    failure of the MCP server behind it, if any (the tool server stashes it on the rollout)."""
    try:
        message = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError) as e:
        return rpc_error(400, PARSE_ERROR, f"the body is not JSON: {e}")
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
        if isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message):
            return web.Response(status=202)  # a response to a request we never sent: accepted, ignored
        return rpc_error(
            400,
            INVALID_REQUEST,
            "expected one JSON-RPC 2.0 request or notification object (batches are not part of MCP since 2025-06-18)",
        )
    if "id" not in message:  # a notification (notifications/initialized, cancelled): nothing to answer
        return web.Response(status=202)
    id, method = message["id"], message["method"]
    params = message.get("params") or {}
    if not isinstance(params, dict):
        return rpc_error(200, INVALID_PARAMS, f"params of {method!r} must be an object", id)
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        meta = {}
    version = meta.get(VERSION_META) or header_version
    modern = version in MODERN_VERSIONS
    if version is not None and method != "initialize" and version not in (*HANDSHAKE_VERSIONS, *MODERN_VERSIONS):
        error = {
            "code": UNSUPPORTED_PROTOCOL_VERSION,
            "message": f"unsupported protocol version {version!r}",
            "data": {"supported": [*HANDSHAKE_VERSIONS, *MODERN_VERSIONS], "requested": version},
        }
        return web.json_response({"jsonrpc": "2.0", "id": id, "error": error}, status=400)
    server = toolset.name
    if method == "initialize":
        asked = params.get("protocolVersion")
        agreed = asked if asked in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[-1]
        return _result(
            id, {"protocolVersion": agreed, "capabilities": _CAPABILITIES, "serverInfo": _info(server)}, False, server
        )
    if method == "server/discover":
        discovered = {"supportedVersions": list(MODERN_VERSIONS), "capabilities": _CAPABILITIES, **_UNCACHED}
        return _result(id, discovered, True, server)
    if method == "ping":
        return _result(id, {}, modern, server)
    if method == "tools/list":
        return _result(id, {"tools": tool_list(toolset), **(_UNCACHED if modern else {})}, modern, server)
    if method != "tools/call":
        return rpc_error(200, METHOD_NOT_FOUND, f"method {method!r} is not served (this server has tools only)", id)
    name, arguments = params.get("name"), params.get("arguments", {})
    if not isinstance(name, str):
        return rpc_error(200, INVALID_PARAMS, "tools/call needs params.name, the tool's name (a string)", id)
    try:
        outcome = await call_tool(
            toolset, name, {} if arguments is None else arguments, runtime, timeout=timeout, on_call=on_call
        )
    except ToolInputError as e:
        if e.status_code == 404:  # the spec's answer to an unknown tool: a protocol error
            return rpc_error(200, INVALID_PARAMS, str(e), id)
        outcome = ToolOutcome(str(e), error=str(e))  # bad arguments: the model sees them and retries
    except (SandboxError, InfrastructureLost) as e:
        return rpc_error(503, INTERNAL_ERROR, f"the rollout's runtime died: {type(e).__name__}: {e}", id)
    except ToolServerError as e:
        if on_error is not None:
            on_error(e)
        return rpc_error(502, INTERNAL_ERROR, str(e), id)
    return _result(id, call_result(outcome), modern, server)
