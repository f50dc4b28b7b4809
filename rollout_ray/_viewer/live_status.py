"""A live run in the viewer: the status its driver keeps in ``status.json`` (``_driver/control``).

``GET /api/live?run=ID`` answers ``{"live": bool, "status": {...} | null}``: live while the
driver says it runs (``running``, ``paused``, ``stopping``) and its file is fresh; the page
then shows the status above the run's table and refreshes itself. A status file the viewer
cannot use (not a JSON object, ``updated_at`` not a time, over ``MAX_STATUS_BYTES``) is not
live either: the answer's ``error`` says why, and the page shows it.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from .._record.run_layout import STATUS, RunLayout

LIVE_STATES = ("running", "paused", "stopping")
STALE_AFTER = 30.0
"""Seconds after which a status not refreshed is a driver gone (killed), not a live run."""
MAX_STATUS_BYTES = 8 << 20
"""The largest ``status.json`` the viewer reads: the page reads it every few seconds, and a
driver's own status (a line per rollout in flight) stays far below this even at thousands."""


def live_status(run_dir: Any) -> dict[str, Any]:
    """The run's status and whether it is live; no status file: not live."""
    try:
        with RunLayout.of(run_dir).open() as run, run.reader(STATUS) as f:  # through no link
            size = os.fstat(f.fileno()).st_size
            data = f.read(MAX_STATUS_BYTES + 1)  # bounded even if it grows between the two
    except (OSError, ValueError):  # CorruptRun (a link) too: not live
        return {"live": False, "status": None}
    if max(size, len(data)) > MAX_STATUS_BYTES:
        return _unusable(
            f"it is {size:,} bytes, over the viewer's bound of {MAX_STATUS_BYTES:,} bytes; "
            "see the run with `rollout-ray ctl RUN_DIR status`"
        )
    try:
        status = json.loads(data)
    except ValueError:
        return _unusable("it is not JSON")
    if not isinstance(status, dict):
        return _unusable(f"it must be a JSON object, not a {type(status).__name__}")
    updated = status.get("updated_at", 0)
    if isinstance(updated, bool) or not isinstance(updated, int | float) or not math.isfinite(updated):
        return _unusable(f"its updated_at must be a time in seconds, got {updated!r:.40}")
    fresh = time.time() - updated < STALE_AFTER
    return {"live": status.get("state") in LIVE_STATES and fresh, "status": status}


def _unusable(why: str) -> dict[str, Any]:
    return {"live": False, "status": None, "error": f"status.json: {why}"}
