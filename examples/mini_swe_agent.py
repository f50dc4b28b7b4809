"""mini-swe-agent, unchanged, on the coding tasks of ``codex.py``: installed once per node from
the package index (``pip install mini-swe-agent==2.4.6``, pinned), run through its Python API
against the rollout's proxy (Chat Completions, its ``bash`` tool). The simulated model follows
the plan in the prompt, then sends mini-swe-agent's submit command; the reward reads the files
it left in the sandbox.

    rollout-ray eval examples/mini_swe_agent.py --limit 2
"""

from __future__ import annotations

import os
import sys

from rollout_ray import MiniSweAgentHarness

sys.path.insert(0, os.path.dirname(__file__))
from codex import WriteAFile, coding_tasks


def tasks(n: int = 4) -> list[WriteAFile]:
    return [WriteAFile(row) for row in coding_tasks(n)]


def harness() -> MiniSweAgentHarness:
    return MiniSweAgentHarness(timeout=300)
