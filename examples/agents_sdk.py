"""An OpenAI Agents SDK program on the coding tasks of ``codex.py``: the SDK installed once per
node from the package index (``openai-agents==0.24.0``, pinned), one ``Agent`` with a ``bash``
tool and the task's tools over MCP, against the rollout's proxy (Responses). The simulated
model follows the plan in the prompt through the ``bash`` tool; the reward reads the files left
in the sandbox.

    rollout-ray eval examples/agents_sdk.py --limit 2
"""

from __future__ import annotations

import os
import sys

from rollout_ray import AgentsSdkHarness

sys.path.insert(0, os.path.dirname(__file__))
from codex import WriteAFile, coding_tasks


def tasks(n: int = 4) -> list[WriteAFile]:
    return [WriteAFile(row) for row in coding_tasks(n)]


def harness() -> AgentsSdkHarness:
    return AgentsSdkHarness(instructions="Carry out the task with the bash tool.", timeout=300)
