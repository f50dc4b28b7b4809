"""Claude Code, unchanged, as a ProgramHarness agent: ``claude -p`` with ANTHROPIC_BASE_URL /
ANTHROPIC_API_KEY (set by the harness) pointing at the rollout's proxy, non-essential
traffic off, its state in the work directory. ``CLAUDE`` is the path of the ``claude`` binary."""

import json
import os

with open(os.environ["ROLLOUT_RAY_INPUT"]) as f:
    prompt = next(m["content"] for m in json.load(f)["messages"] if m["role"] == "user")
home = os.path.abspath(".claude-home")
os.makedirs(home, exist_ok=True)
env = {**os.environ, "HOME": home, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1"}
os.execve(os.environ["CLAUDE"], ["claude", "-p", "--model", "simulated", prompt], env)
