"""Codex CLI, unchanged, as a ProgramHarness agent: ``codex exec`` with a model provider
pointing at the rollout's proxy (``wire_api = "responses"``), its key the rollout's secret.
``CODEX`` is the path of the ``codex`` binary; its state goes to the work directory, and its
own traffic to OpenAI's and GitHub's servers is switched off."""

import json
import os

with open(os.environ["ROLLOUT_RAY_INPUT"]) as f:
    prompt = next(m["content"] for m in json.load(f)["messages"] if m["role"] == "user")
home = os.path.abspath(".codex-home")
os.makedirs(home, exist_ok=True)
with open(os.path.join(home, "config.toml"), "w") as f:
    f.write(f"""model = "simulated"
model_provider = "rollout"
check_for_update_on_startup = false
[model_providers.rollout]
name = "rollout"
base_url = {json.dumps(os.environ["OPENAI_BASE_URL"])}
env_key = "OPENAI_API_KEY"
wire_api = "responses"
# Codex's own traffic (metrics to ab.chatgpt.com, analytics, a plugin sync from GitHub) off:
# in a network namespace it only failed, after ~5 s; outside one it would leave the machine.
[analytics]
enabled = false
[otel]
exporter = "none"
metrics_exporter = "none"
[features]
plugins = false
""")
env = {**os.environ, "HOME": home, "CODEX_HOME": home}
os.execve(os.environ["CODEX"], ["codex", "exec", "--skip-git-repo-check", prompt], env)
