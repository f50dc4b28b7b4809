"""Claude Code, unchanged, on the coding tasks of ``codex.py``: ``claude -p`` (installed once
per node from the npm registry, pinned) against the rollout's proxy, which speaks the Anthropic
Messages API to it. The simulated model follows the plan in the prompt through Claude Code's
``Bash`` and ``Write`` tools; the reward reads the files it left in the sandbox.

    rollout-ray eval examples/claude_code.py --limit 2
"""

from __future__ import annotations

import os
import sys

from rollout_ray import ClaudeCodeHarness

sys.path.insert(0, os.path.dirname(__file__))
from codex import WriteAFile, coding_tasks


def tasks(n: int = 4) -> list[WriteAFile]:
    return [WriteAFile(row) for row in coding_tasks(n)]


def harness() -> ClaudeCodeHarness:
    return ClaudeCodeHarness(timeout=300)
