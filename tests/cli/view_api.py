"""The viewer's API as a user's browser reaches it: a real ``rollout-ray view`` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

CLI = [sys.executable, "-m", "rollout_ray"]


def view_api(run_dir: Path, *paths: str) -> list[Any]:
    """GET each path from a real ``rollout-ray view RUN_DIR`` process."""
    proc = subprocess.Popen(
        [*CLI, "view", str(run_dir), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("viewing 1 run(s) at http://127.0.0.1:"), line
        url = line.split(" at ", 1)[1].split()[0]
        out = []
        for path in paths:
            with urllib.request.urlopen(url + path, timeout=30) as response:
                out.append(json.load(response))
        return out
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
