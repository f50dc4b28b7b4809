"""Any MCP server as a task's toolset: ``MCPToolset(name, url=...)`` or ``command=[...]``.

The server is plugged in unchanged: its tools (``tools/list``) are the toolset's, offered to
the model as they are, and a call goes to the server as ``tools/call``. The toolset is
plain data until it is opened where the tools are served (the node's tool server, or the
rollout's process for an in-process harness): there it takes this process's client of the
server (``mcp_pool``): one per HTTP server for every rollout served here; one stdio server
per rollout's runtime, started on first use and stopped when the runtime's last rollout lets
go of it; the stdio server runs IN that runtime (a sandboxed rollout's server is sandboxed
too). Calls land on ``trace.tool_calls`` and run under the tool server's bounds like any
toolset's.

A server that fails (unreachable, dead, hung, garbage, too big) fails the rollout with a
``ToolServerError`` naming it; a tool that fails (``isError``) or a JSON-RPC error (an
unknown tool) is an error the model sees.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from .._core.runtime import Runtime
from .._core.tools import CALLER
from .._core.toolset import _NAME, Toolset
from .._errors import ToolInputError, ToolsetError
from .._record.messages import Tool
from .mcp_client import Limits, _Client
from .mcp_pool import http_client, release_stdio, stdio_client
from .mcp_stdio import StdioClient

ROLLOUT_META = "rollout-ray/rollout"
"""The key of a ``tools/call``'s ``_meta`` that names the calling rollout (its trace id)."""


class ToolFailed(Exception):
    """The MCP tool answered ``isError``: its text is what the model sees."""


class MCPToolset(Toolset):
    """An MCP server's tools.

    Args:
        name: the tool server's name (as a ``Toolset``'s ``name``).
        url: a streamable HTTP endpoint (e.g. ``http://127.0.0.1:8000/mcp``); or
        command: a stdio server to start (e.g. ``["npx", "-y", "@modelcontextprotocol/server-filesystem", "/data"]``),
            one per rollout runtime, run in that runtime as its programs are (its filesystem,
            network policy and environment allow-list, plus ``env``), working in ``cwd`` (a
            directory of the runtime) or the runtime's work directory. A rollout without a
            runtime runs it on the host, its environment ``env`` over HOME, LOGNAME, PATH,
            SHELL, TERM and USER of this process, in ``cwd`` or a fresh empty directory.
        files: for a stdio server, files written into its working directory before it starts
            (relative path -> content), as ``ProgramHarness(files=)``: a server whose script is
            on the host (in a checkout) ships it this way, since a sandbox sees none of it.
        headers: sent with every HTTP request (e.g. ``Authorization``).
        timeout: seconds per request to the server; over it the rollout fails with
            ``ToolServerError``. Keep it under the tool server's ``call_timeout`` (60 s), which
            otherwise answers the call as timed out first.
        start_timeout: seconds for the ``initialize`` handshake.
        max_message: bytes of one message from the server.
        max_connections: HTTP connections to the server per process (per node).
        max_starting: stdio servers starting at once per process (per node).
    """

    def __init__(
        self,
        name: str,
        *,
        url: str | None = None,
        command: Sequence[str] | None = None,
        headers: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        files: Mapping[str, str | bytes] | None = None,
        timeout: float = 30.0,
        start_timeout: float = 30.0,
        max_message: int = 16 << 20,
        max_connections: int = 32,
        max_starting: int = 4,
    ) -> None:
        if not _NAME.match(name):
            raise ToolsetError(f"MCPToolset name {name!r} must match {_NAME.pattern}")
        if (url is None) == (not command):
            raise ToolsetError(f"MCPToolset {name!r}: pass url= (streamable HTTP) or command= (stdio), one of them")
        if url is not None and not url.startswith(("http://", "https://")):
            raise ToolsetError(f"MCPToolset {name!r}: url must be http:// or https://, got {url!r}")
        if files and url is not None:
            raise ToolsetError(
                f"MCPToolset {name!r}: files= is for a stdio server (command=); a server at a url has its own"
            )
        self.name = name  # type: ignore[misc]  # per instance: one class serves many servers
        self.url, self.command = url, list(command or [])
        self.headers, self.env, self.cwd = dict(headers or {}), None if env is None else dict(env), cwd
        self.files = dict(files or {})
        self.limits = Limits(
            timeout=timeout,
            start_timeout=start_timeout,
            max_message=max_message,
            max_connections=max_connections,
            max_starting=max_starting,
        )
        self._client: _Client | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}  # a client lives in the process that opened it

    def wants_runtime(self) -> bool:
        return bool(self.command)  # a stdio server is one per runtime

    async def _open_tools(self, runtime: Runtime | None) -> None:
        if self.url is not None:
            client: _Client = http_client(self.name, self.url, self.headers, self.limits)
        else:
            # Without a runtime, the server is this toolset's own: keyed on nothing, it was shared
            # by every runtime-less rollout of the process (one rollout's files and state seen by another).
            owner = f"toolset-{id(self)}" if runtime is None else runtime.id
            client = stdio_client(self.name, self.command, self.env, self.cwd, self.limits, owner, runtime, self.files)
        await self._use(client)

    async def _use(self, client: _Client) -> None:
        """Serve the tools through ``client``, once it is ready (its tools listed)."""
        self._client = client
        try:
            await client.ready()
        except BaseException:
            await self._close_tools()
            raise

    async def _close_tools(self) -> None:
        client, self._client = self._client, None
        if isinstance(client, StdioClient):
            await release_stdio(client)

    def _listed(self) -> list[dict[str, Any]]:
        if self._client is None or self._client.tools is None:
            raise ToolsetError(f"MCPToolset {self.name!r} is not open: its tools are listed where it is served")
        return self._client.tools

    def specs(self) -> list[Tool]:
        return [
            Tool(t["name"], str(t.get("description") or ""), dict(t.get("inputSchema") or {"type": "object"}))
            for t in self._listed()
        ]

    def _bind(self, name: str, arguments: Any, runtime: Runtime | None) -> tuple[Any, dict[str, Any]]:
        if not any(t["name"] == name for t in self._listed()):
            raise ToolInputError(f"unknown tool {name!r} in tool server {self.name!r}", 404)
        if not isinstance(arguments, dict):
            raise ToolInputError(f"invalid arguments for tool {name!r}: an object is needed", 400)
        return self._call_remote, {"tool": name, "arguments": arguments}

    async def _call_remote(self, tool: str, arguments: dict[str, Any]) -> str:
        if self._client is None:
            raise ToolsetError(f"MCPToolset {self.name!r} is not open")
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        caller = CALLER.get()
        if caller is not None:  # a server shared by many rollouts learns whose call it is
            params["_meta"] = {ROLLOUT_META: caller}
        result = await self._client.request("tools/call", params)
        text = _text(result)
        if result.get("isError"):
            raise ToolFailed(text)
        return text


def _text(result: Mapping[str, Any]) -> str:
    """What the model sees of a ``CallToolResult``: its text blocks, other blocks as JSON, or
    the structured content when there is no block."""
    blocks = result.get("content")
    if not isinstance(blocks, list) or not blocks:
        structured = result.get("structuredContent")
        return "" if structured is None else msgspec.json.encode(structured).decode()
    parts = [
        b["text"]
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        else msgspec.json.encode(b).decode()
        for b in blocks
    ]
    return "\n".join(parts)
