"""The viewer's live panel's data: a run's status.json as its driver keeps it (``/api/live``)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from test_viewer_api import get
from viewer_runs import write_run

from rollout_ray._viewer.server import Viewer, start


def _status(state: str, updated_at: float) -> dict[str, Any]:
    rollout = {
        "label": "0-ab#0",
        "id": "f" * 32,
        "task": 0,
        "phase": "model call",
        "age": 700.0,
        "running": 701.0,
        "attempt": 1,
        "stalled": True,
    }
    return {
        "state": state,
        "updated_at": updated_at,
        "progress": {"total": 4, "done": 1, "failed": 0, "in_flight": 1, "retried": 0, "skipped": 0, "rate": 0.5},
        "max_in_flight": 2,
        "phases": {"model call": 1},
        "rollouts": [rollout],
        "stalled": 1,
        "servers": [],
        "model_call_errors": 0,
    }


def test_a_run_whose_driver_keeps_its_status_fresh_is_live_with_its_stalled_rollouts(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "arith", 4)
    viewer = Viewer([run_dir])
    assert get(viewer, "/api/live", run="arith") == {"live": False, "status": None}  # a run that never had one
    status = run_dir / "status.json"
    status.write_text(json.dumps(_status("running", time.time())))
    live = get(viewer, "/api/live", run="arith")
    assert live["live"] and live["status"]["rollouts"][0]["stalled"]
    status.write_text(json.dumps(_status("completed", time.time())))
    assert not get(viewer, "/api/live", run="arith")["live"]
    status.write_text(json.dumps(_status("running", time.time() - 3600)))  # its driver was killed
    assert not get(viewer, "/api/live", run="arith")["live"]


async def _watch_live(run_dir: Path, tmp_path: Path) -> None:
    from cdp import Browser, find_chromium

    runner, url = await start(Viewer([run_dir]))
    browser = await Browser.launch(find_chromium(), tmp_path / "profile")  # type: ignore[arg-type]
    try:
        page = await browser.page()
        try:
            await page.navigate(url + "#/run/arith")
            assert await page.wait_for("document.querySelectorAll('.live tr.stalled').length === 1")
            assert "Live: running" in await page.evaluate("document.querySelector('.live h2').textContent")
            done = json.loads((run_dir / "status.json").read_text())
            done["progress"]["done"], done["rollouts"], done["stalled"] = 3, [], 0
            (run_dir / "status.json").write_text(json.dumps(done))
            # The page refreshes itself: the new status shows without a reload.
            assert await page.wait_for(
                "document.querySelector('.live') && document.querySelectorAll("
                "'.live tr.stalled').length === 0 && document.querySelector('.live p')"
                ".textContent.startsWith('done 3 of 4')"
            )
            (run_dir / "status.json").write_text(json.dumps({**done, "state": "completed"}))
            assert await page.wait_for("app.dataset.state === 'ready' && !document.querySelector('.live')")
            assert page.errors == []
        finally:
            await page.close()
    finally:
        await browser.close()
        await runner.cleanup()


@pytest.mark.skipif(
    shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
    reason="no chromium binary (Debian: apt-get install chromium)",
)
@pytest.mark.timeout(120)
def test_the_run_page_shows_a_live_run_refreshing_with_its_stalled_rollouts_marked(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "arith", 4)
    (run_dir / "status.json").write_text(json.dumps(_status("running", time.time())))
    asyncio.run(_watch_live(run_dir, tmp_path))


def test_a_status_file_not_an_object_or_with_a_bad_updated_at_or_too_large_is_not_live_and_says_why(
    tmp_path: Path,
) -> None:
    from rollout_ray._viewer import live_status as live

    run_dir = write_run(tmp_path / "arith", 4)
    status = run_dir / "status.json"
    good = _status("running", time.time())
    cases = {
        "a JSON object": json.dumps([good]),
        "updated_at": json.dumps({**good, "updated_at": "now"}),
        "not JSON": "{",
        "bytes": json.dumps({**good, "pad": "x" * live.MAX_STATUS_BYTES}),
    }
    for says, text in cases.items():
        status.write_text(text)
        answer = get(Viewer([run_dir]), "/api/live", run="arith")  # a 200, not a 500
        assert answer["live"] is False and answer["status"] is None and says in answer["error"], (says, answer)
    status.write_text(json.dumps(good))
    assert get(Viewer([run_dir]), "/api/live", run="arith")["live"] is True
