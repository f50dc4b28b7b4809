"""Presets: real coding agents as ``ProgramHarness`` rollouts, installed per node, pinned.

``CodexHarness()`` runs Codex CLI (``@openai/codex``, ``codex exec``, Responses at the proxy),
``ClaudeCodeHarness()`` Claude Code (``@anthropic-ai/claude-code``, ``claude -p``, Messages at
the proxy), ``MiniSweAgentHarness()`` mini-swe-agent (PyPI ``mini-swe-agent``, its Python API,
Chat Completions at the proxy), ``AgentsSdkHarness()`` an OpenAI Agents SDK program (PyPI
``openai-agents``, Responses at the proxy). Each installs its agent from its registry on the
rollout's node in ``setup`` (once per node: ``agent_install.py``), ships a small launcher
(``agent_programs/``) into the work directory and runs it; the launcher configures the agent to
talk only to the rollout's proxy and its tool servers (the task's ``Toolset`` as MCP servers),
with the agent's own traffic off.

Each launcher passes the whole conversation (``agent_programs/task_prompt.py``, shipped beside
it): the task's system prompt as the agent's instructions option, the rest as its prompt (the
task's prompt unchanged when it is one user message; a transcript of the turns before it
otherwise; Agents SDK input items).

Adding another agent: a launcher that reads the conversation with ``task_prompt`` and the
endpoint variables ``ProgramHarness`` sets and ``exec``s the agent, and a subclass of
``AgentHarness`` naming how to install it (``install``) and the variable its launcher finds it
in (docs/agents.md).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from pathlib import Path

from .._core.runtime import Runtime
from .agent_install import npm_install, npm_missing, pip_install, pip_missing
from .program import ProgramHarness

PROGRAMS = Path(__file__).parent / "agent_programs"
LAUNCHER_DIR = ".rollout_ray_agent"
"""Directory of the work dir the launcher is written to."""
SHARED = "task_prompt.py"
"""The module of ``agent_programs/`` every launcher imports, shipped beside it."""


class AgentHarness(ProgramHarness):
    """A ``ProgramHarness`` whose program is installed on the node by ``setup``.

    Subclasses set ``launcher`` (a file of ``agent_programs/``) and ``variable`` (the
    environment variable giving the launcher the installed binary), and define ``install``.

    Args:
        model: the model name the agent sends (the proxy serves the rollout's model whatever
            the name).
        env: extra environment variables of the agent.
        timeout: seconds a segment may run (see ``ProgramHarness``).
        id: harness id.
    """

    launcher = ""
    variable = ""

    def __init__(
        self,
        *,
        model: str = "rollout",
        env: Mapping[str, str] | None = None,
        timeout: float | None = 600.0,
        id: str | None = None,
    ) -> None:
        path = f"{LAUNCHER_DIR}/{self.launcher}"
        # sys.executable runs in a sandbox too (it links it); the launcher needs only the stdlib.
        super().__init__(
            [sys.executable, path],
            id=id or self.launcher.removesuffix(".py"),
            env={"ROLLOUT_AGENT_MODEL": model, **(env or {})},
            timeout=timeout,
            files={
                path: (PROGRAMS / self.launcher).read_text(),
                f"{LAUNCHER_DIR}/{SHARED}": (PROGRAMS / SHARED).read_text(),
            },
        )

    def install(self) -> str:
        """Install the agent on this node if it is not yet (blocking); its binary's path."""
        raise NotImplementedError

    def missing(self) -> str | None:
        """What ``install`` would fetch on this node (``npm @openai/codex@0.169.0``), or None when
        it is installed here or unknown. ``rollout-ray eval`` says it before the run: an install
        takes minutes inside the first rollout's setup, which showed nothing meanwhile."""
        return None

    async def setup(self, runtime: Runtime) -> None:
        """Install the agent on this node (once: later rollouts find it), then ship the launcher."""
        self.env[self.variable] = await asyncio.to_thread(self.install)
        await super().setup(runtime)


class CodexHarness(AgentHarness):
    """Codex CLI (``@openai/codex`` from the npm registry), ``codex exec`` on the task's prompt,
    its model provider the rollout's proxy (``wire_api = "responses"``), the task's tools as MCP
    servers in its ``config.toml``, telemetry, analytics and plugin sync off, its own sandbox
    bypassed (the rollout's runtime isolates it)."""

    launcher = "codex_exec.py"
    variable = "CODEX"

    def __init__(
        self,
        *,
        version: str = "0.169.0",
        model: str = "rollout",
        env: Mapping[str, str] | None = None,
        timeout: float | None = 600.0,
        id: str | None = None,
    ) -> None:
        self.version = version
        super().__init__(model=model, env=env, timeout=timeout, id=id)

    def install(self) -> str:
        return str(npm_install("@openai/codex", self.version, "codex"))

    def missing(self) -> str | None:
        return npm_missing("@openai/codex", self.version)


class ClaudeCodeHarness(AgentHarness):
    """Claude Code (``@anthropic-ai/claude-code`` from the npm registry), ``claude -p`` on the
    task's prompt with ``ANTHROPIC_BASE_URL`` at the rollout's proxy,
    ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``, a HOME per rollout in its work directory,
    the task's tools as MCP servers (``--mcp-config``), its Bash, file and MCP tools allowed."""

    launcher = "claude_print.py"
    variable = "CLAUDE"

    def __init__(
        self,
        *,
        version: str = "2.1.328",
        model: str = "rollout",
        env: Mapping[str, str] | None = None,
        timeout: float | None = 600.0,
        id: str | None = None,
    ) -> None:
        self.version = version
        super().__init__(model=model, env=env, timeout=timeout, id=id)

    def install(self) -> str:
        return str(npm_install("@anthropic-ai/claude-code", self.version, "claude"))

    def missing(self) -> str | None:
        return npm_missing("@anthropic-ai/claude-code", self.version)


class MiniSweAgentHarness(AgentHarness):
    """mini-swe-agent (``mini-swe-agent`` from the package index, ``pip install --target`` once
    per node, with its dependencies), run through its Python API with its own ``default.yaml``:
    bash actions as tool calls to the rollout's proxy through litellm, commands in the work
    directory, its price list and cost tracking kept off the network; prints the submission.
    ``step_limit`` bounds its steps (its default has none)."""

    launcher = "mini_swe_agent.py"
    variable = "MINI_SWE_AGENT"

    def __init__(
        self,
        *,
        version: str = "2.4.6",
        step_limit: int = 30,
        model: str = "rollout",
        env: Mapping[str, str] | None = None,
        timeout: float | None = 600.0,
        id: str | None = None,
    ) -> None:
        self.version = version
        super().__init__(
            model=model, env={"MINI_SWE_AGENT_STEP_LIMIT": str(step_limit), **(env or {})}, timeout=timeout, id=id
        )

    def install(self) -> str:
        return str(pip_install(f"mini-swe-agent=={self.version}"))

    def missing(self) -> str | None:
        return pip_missing(f"mini-swe-agent=={self.version}")


class AgentsSdkHarness(AgentHarness):
    """An OpenAI Agents SDK program (``openai-agents`` from the package index, ``pip install
    --target`` once per node): one ``Agent`` with a ``bash`` tool and the task's tools as MCP
    servers, its model ``OpenAIResponsesModel`` at the rollout's proxy, run on the task's prompt
    for at most ``max_turns`` turns, trace export off; prints the final output. A program of
    your own runs as a ``ProgramHarness`` the same way (see ``agent_programs/agents_sdk.py``)."""

    launcher = "agents_sdk.py"
    variable = "AGENTS_SDK"

    def __init__(
        self,
        *,
        version: str = "0.24.0",
        instructions: str = "",
        max_turns: int = 30,
        model: str = "rollout",
        env: Mapping[str, str] | None = None,
        timeout: float | None = 600.0,
        id: str | None = None,
    ) -> None:
        self.version = version
        extra = {"AGENTS_SDK_INSTRUCTIONS": instructions, "AGENTS_SDK_MAX_TURNS": str(max_turns)}
        super().__init__(model=model, env={**extra, **(env or {})}, timeout=timeout, id=id)

    def install(self) -> str:
        return str(pip_install(f"openai-agents=={self.version}"))

    def missing(self) -> str | None:
        return pip_missing(f"openai-agents=={self.version}")
