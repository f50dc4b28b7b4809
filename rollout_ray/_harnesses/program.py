"""ProgramHarness: the agent is a program run in the rollout's runtime, one run per segment.

The program finds everything in its environment:

* ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``: the rollout's model endpoint (ends in ``/v1``)
  and bearer, so any OpenAI SDK works unchanged (Chat Completions or Responses);
* ``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY``: the same proxy and key for the
  ``anthropic`` SDK and Claude Code (which add ``/v1/messages`` themselves);
* ``ROLLOUT_RAY_TOOLS``: JSON ``{server name: url}`` of the tool servers (see ``_serving/tool_server``);
* ``ROLLOUT_RAY_MCP``: the same tool servers as MCP servers, in the ``.mcp.json`` shape MCP
  clients read (``{"mcpServers": {name: {"type": "http", "url": ...}}}``, each URL carrying the
  rollout's token), so a program that speaks MCP (Claude Code, Codex, any ``mcp`` client) uses
  them unchanged;
* ``ROLLOUT_RAY_TOOL_GATE``: the tool gate's URL (§5.3; ``POST`` with the model key), when
  the harness declares ``supports_tool_interception`` and the task has request hooks;
* ``ROLLOUT_RAY_STATE_URL`` / ``ROLLOUT_RAY_STATE_SECRET``: the rollout's ``/state`` route and
  its bearer, when the harness declares ``uses_state`` (a subclass setting the flag);
* ``ROLLOUT_RAY_INPUT``: path, relative to the program's working directory (the runtime's
  work dir), of a JSON file ``{"messages": [OpenAI chat messages]}``: on launch the system
  prompt and the prompt, on resume the conversation so far plus the new user messages.

The segment ends when the program exits; the session checks its exit code (B26).
``examples/agent_program.py`` is a stdlib-only program of this kind.

A program that must be *in* the runtime (a ``SandboxRuntime`` sees nothing of the host's
checkout) is shipped with ``files``: ``setup`` writes them into the work directory, e.g.
``ProgramHarness(["python3", "agent.py"], files={"agent.py": source})``. Its imports come
from the Python environment running rollout-ray: a sandbox shows that environment's
packages read-only, with ``python3`` and ``sys.executable`` running it, so ``pip install
openai`` there is what an agent importing ``openai`` needs.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from .._core.harness import OUTPUT_TAIL, Harness, HarnessContext
from .._core.runtime import ProgramResult, Runtime
from .._errors import HarnessError
from .._record.messages import Message
from .._record.trace import Trace
from .conversation import opening_messages, resumed_messages

INPUT_DIR = ".rollout_ray"
"""Directory of the work dir holding per-rollout input files (removed by ``cleanup``)."""


def mcp_servers(tool_urls: Mapping[str, str]) -> dict[str, Any]:
    """The ``.mcp.json`` of the rollout's tool servers: each one's MCP endpoint is its URL plus
    ``/mcp`` (``_serving/tool_server``)."""
    return {"mcpServers": {name: {"type": "http", "url": f"{url}/mcp"} for name, url in tool_urls.items()}}


class ProgramHarness(Harness):
    """Runs ``command`` in the rollout's runtime for each segment.

    Args:
        command: the program and its arguments.
        id: harness id.
        env: extra environment variables of the program.
        timeout: seconds a segment may run; the program's whole process tree is then killed
            and the segment fails with ``HarnessError`` (unless the rollout stopped).
        max_output: bytes kept of each of stdout and stderr.
        files: files written into the runtime's work directory by ``setup`` (relative path
            to content, ``str`` as UTF-8), after the task's setup, before the program runs.

    Raises:
        ValueError: no command, or a file path that is absolute or climbs out with ``..``.
    """

    supports_resume = True

    def __init__(
        self,
        command: Sequence[str],
        *,
        id: str = "program",
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_output: int = 1 << 20,
        files: Mapping[str, str | bytes] | None = None,
    ) -> None:
        super().__init__(id)
        if not command:
            raise ValueError("ProgramHarness needs a command to run")
        self.command = list(command)
        self.env = dict(env or {})
        self.timeout = timeout
        self.max_output = max_output
        self.files = dict(files or {})
        for path in self.files:
            if os.path.isabs(path) or os.path.normpath(path).split(os.sep)[0] == "..":
                raise ValueError(f"ProgramHarness files must be relative to the work directory, got {path!r}")

    async def setup(self, runtime: Runtime) -> None:
        """Write ``files`` into the runtime (provisions the harness into the box)."""
        for path, content in self.files.items():
            await runtime.write(path, content)

    async def launch(self, ctx: HarnessContext) -> ProgramResult:
        return await self._run(ctx, opening_messages(ctx))

    async def resume(self, ctx: HarnessContext, messages: Sequence[Message]) -> ProgramResult:
        return await self._run(ctx, resumed_messages(ctx, messages))

    async def _run(self, ctx: HarnessContext, messages: list[dict[str, Any]]) -> ProgramResult:
        # A fresh file per segment: the harness is shared by rollouts, its segments never collide.
        path = f"{INPUT_DIR}/{ctx.trace.id}/input-{uuid.uuid4().hex[:8]}.json"
        await ctx.runtime.write(path, json.dumps({"messages": messages}))
        env = {
            **self.env,
            "OPENAI_BASE_URL": ctx.endpoint,
            "OPENAI_API_KEY": ctx.secret,
            "ANTHROPIC_BASE_URL": ctx.endpoint.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": ctx.secret,
            "ROLLOUT_RAY_TOOLS": json.dumps(ctx.tool_urls),
            "ROLLOUT_RAY_MCP": json.dumps(mcp_servers(ctx.tool_urls)),
            "ROLLOUT_RAY_INPUT": path,
        }
        if ctx.tool_interception_url is not None:
            env["ROLLOUT_RAY_TOOL_GATE"] = ctx.tool_interception_url
        if ctx.state_url is not None and ctx.state_secret is not None:
            env["ROLLOUT_RAY_STATE_URL"], env["ROLLOUT_RAY_STATE_SECRET"] = ctx.state_url, ctx.state_secret
        result = await ctx.runtime.exec(self.command, env=env, timeout=self.timeout, max_output=self.max_output)
        if result.timed_out:
            await ctx.sync()
        if result.timed_out and not ctx.trace.stopped:
            tail = (result.stderr or result.stdout or "<no output>")[-OUTPUT_TAIL:]
            raise HarnessError(f"harness '{self.id}' timed out after {self.timeout:g}s: {tail}")
        return result

    async def cleanup(self, trace: Trace, runtime: Runtime) -> None:
        """Remove the rollout's input files (idempotent; a runtime already gone is fine)."""
        with contextlib.suppress(Exception):
            await runtime.exec(["rm", "-rf", f"{INPUT_DIR}/{trace.id}"], timeout=10.0)
