"""Codex CLI, unchanged: ``codex exec`` with a model provider at the rollout's proxy
(``wire_api = "responses"``), its key the rollout's secret, the rollout's tool servers as MCP
servers, its state (``CODEX_HOME``, ``HOME``) in the work directory. Codex's own traffic
(metrics to ab.chatgpt.com, analytics, a plugin sync from GitHub) is switched off: in a sandbox
it only fails after ~5 s, outside one it would leave the machine. Its own sandbox is bypassed:
the rollout's runtime is the isolation (and Codex's would need privileges a sandbox lacks).

The task's system prompt becomes Codex's ``developer_instructions`` (a developer message after
its own instructions, which it needs to drive its tools); the conversation is its prompt
(``task_prompt.py``).

Environment: ``CODEX`` (the binary), ``ROLLOUT_AGENT_MODEL``, and ``ProgramHarness``'s."""

import json
import os

import task_prompt

conversation = task_prompt.messages()
instructions = task_prompt.instructions(conversation)
home = os.path.abspath(".codex-home")
os.makedirs(home, exist_ok=True)
mcp = json.loads(os.environ.get("ROLLOUT_RAY_MCP") or "{}").get("mcpServers", {})
# A top-level key, so before the first table; a TOML basic string: JSON's escapes are TOML's,
# but for \u surrogate pairs (so non-ASCII characters are written as themselves).
developer = f"developer_instructions = {json.dumps(instructions, ensure_ascii=False)}\n" if instructions else ""
servers = "".join(
    f"[mcp_servers.{json.dumps(name)}]\nurl = {json.dumps(server['url'])}\n" for name, server in mcp.items()
)
with open(os.path.join(home, "config.toml"), "w") as f:
    f.write(f"""model = {json.dumps(os.environ.get("ROLLOUT_AGENT_MODEL", "rollout"))}
model_provider = "rollout"
check_for_update_on_startup = false
{developer}[model_providers.rollout]
name = "rollout"
base_url = {json.dumps(os.environ["OPENAI_BASE_URL"])}
env_key = "OPENAI_API_KEY"
wire_api = "responses"
[analytics]
enabled = false
[otel]
exporter = "none"
metrics_exporter = "none"
[features]
plugins = false
{servers}""")
env = {**os.environ, "HOME": home, "CODEX_HOME": home}
os.execve(  # noqa: S606 - the installed agent
    os.environ["CODEX"],
    [
        "codex",
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "--",
        task_prompt.prompt(conversation),
    ],
    env,
)
