"""Claude Code, unchanged: ``claude -p`` with ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY (set by
``ProgramHarness``) at the rollout's proxy, non-essential traffic and telemetry off, a HOME of
its own in the work directory (it writes its state there), the rollout's tool servers as MCP
servers (``--mcp-config``), and its shell, file and MCP tools allowed without asking (``-p``
has nobody to ask; the rollout's runtime is the isolation).

The task's system prompt is appended to Claude Code's own (``--append-system-prompt``: its own
describes its tools); the conversation is its prompt (``task_prompt.py``).

Environment: ``CLAUDE`` (the binary), ``ROLLOUT_AGENT_MODEL``, and ``ProgramHarness``'s."""

import json
import os

import task_prompt

conversation = task_prompt.messages()
instructions = task_prompt.instructions(conversation)
home = os.path.abspath(".claude-home")
os.makedirs(home, exist_ok=True)
mcp = json.loads(os.environ.get("ROLLOUT_RAY_MCP") or "{}")
allowed = ["Bash", "Write", "Edit", "Read", *(f"mcp__{name}" for name in mcp.get("mcpServers", {}))]
argv = [
    "claude",
    "-p",
    "--model",
    os.environ.get("ROLLOUT_AGENT_MODEL", "rollout"),
    "--allowedTools",
    ",".join(allowed),
]
if mcp.get("mcpServers"):
    path = os.path.join(home, "mcp.json")
    with open(path, "w") as f:
        json.dump(mcp, f)
    argv += ["--mcp-config", path, "--strict-mcp-config"]
if instructions:
    argv += ["--append-system-prompt", instructions]
env = {
    **os.environ,
    "HOME": home,
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    # MCP tools offered as tools, not deferred behind its ToolSearch tool (a model must
    # then search for a tool it cannot know the name of).
    "ENABLE_TOOL_SEARCH": "false",
}
os.execve(os.environ["CLAUDE"], [*argv, "--", task_prompt.prompt(conversation)], env)  # noqa: S606 - the installed agent, argv built here
