"""A live run in the viewer: the status its driver keeps in ``status.json`` (``_driver/control``).

``GET /api/live?run=ID`` answers ``{"live": bool, "status": {...} | null}``: live while the
driver says it runs (``running``, ``paused``, ``stopping``) and its file is fresh; the page
then shows the status above the run's table and refreshes itself.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .._record.run_layout import STATUS, RunLayout

LIVE_STATES = ("running", "paused", "stopping")
STALE_AFTER = 30.0
"""Seconds after which a status not refreshed is a driver gone (killed), not a live run."""


def live_status(run_dir: Any) -> dict[str, Any]:
    """The run's status and whether it is live; no status file: not live."""
    try:
        with RunLayout.of(run_dir).open() as run:  # as the run's other files: through no link
            status = json.loads(run.read_bytes(STATUS))
    except (OSError, ValueError):  # CorruptRun (a link) too: not live
        return {"live": False, "status": None}
    fresh = time.time() - float(status.get("updated_at", 0)) < STALE_AFTER
    return {"live": status.get("state") in LIVE_STATES and fresh, "status": status}
