"""The viewer in a real headless browser (issue 13 §4): Debian's Chromium, driven over DevTools.

Load the page, open a run, filter to failed rollouts, open one, and check that its
conversation and its error (type and traceback) are shown. The screenshot goes to
``$ROLLOUT_RAY_SCREENSHOT`` (default: the test's tmp dir), and to ``docs/viewer.png`` as
well with ``ROLLOUT_RAY_UPDATE_SCREENSHOT=1``, which refreshes the README's picture.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest
from cdp import Browser, Page, find_chromium, group_members
from viewer_runs import HOSTILE, failed, rollout_id, write_run

from rollout_ray._cli.summary import plot
from rollout_ray._viewer.server import Viewer, start

REPO = Path(__file__).resolve().parents[2]
N = 24
CHROMIUM = find_chromium()

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no chromium binary (Debian: apt-get install chromium; .ci/run installs it when missing)",
    ),
    pytest.mark.timeout(180),
]


def js(value: object) -> str:
    """A Python value as a JS literal (strings escaped by JSON)."""
    return json.dumps(value)


async def open_failed_rollout(page: Page, url: str) -> str:
    """Runs list → run → filter ok = false → the first failed rollout; returns its id."""
    await page.navigate(url)
    assert await page.wait_for("document.querySelectorAll('a.run-link').length === 2")
    await page.evaluate("[...document.querySelectorAll('a.run-link')].find(a => a.textContent === 'arith').click()")
    assert await page.wait_for(f"document.querySelectorAll('#rollouts tr.rollout-row').length === {N}")
    await page.evaluate("""(() => { const ok = document.querySelector('#filters select[name=ok]');
        ok.value = 'false'; ok.dispatchEvent(new Event('change')); })()""")
    n_failed = sum(failed(i) for i in range(N))
    assert await page.wait_for(
        f"document.querySelectorAll('#rollouts tr.rollout-row').length === {n_failed} && "
        "[...document.querySelectorAll('#rollouts tr.rollout-row')].every(r => r.classList.contains('failed'))"
    )
    assert "ok=false" in await page.evaluate("location.hash")
    for order, arrow in (("asc", "▲"), ("desc", "▼")):  # a header click sorts, and again reverses
        await page.evaluate("document.querySelector('#rollouts th[data-key=reward]').click()")
        assert await page.wait_for(
            f"location.hash.includes('sort=reward&order={order}') && document."
            f"querySelector('#rollouts th[data-key=reward]').textContent.endsWith('{arrow}')"
        )
    assert await page.evaluate("document.querySelectorAll('#rollouts tr.rollout-row.failed').length") == n_failed
    first = await page.evaluate("document.querySelector('#rollouts tr.rollout-row').dataset.id")
    await page.evaluate("document.querySelector('#rollouts tr.rollout-row').click()")
    assert await page.wait_for("app.dataset.view === 'rollout' && app.dataset.state === 'ready'")
    return first


async def check_rollout_page(page: Page, rid: str) -> None:
    shown = await page.evaluate("""(() => ({
        roles: [...document.querySelectorAll('.chat .bubble')].map(b => b.dataset.role),
        user: document.querySelector('.bubble.user .text').textContent,
        call: document.querySelector('.bubble.assistant .toolcall code').textContent,
        args: document.querySelector('.bubble.assistant .toolcall pre').textContent,
        result: document.querySelector('.bubble.tool .text').textContent,
        errorType: document.querySelector('.error-block .error-type').textContent,
        errorMessage: document.querySelector('.error-block .error-message').textContent,
        traceback: document.querySelector('.error-block pre.traceback').textContent,
        siblings: document.querySelectorAll('.siblings tr.sibling').length,
        current: document.querySelector('.siblings tr.current a').textContent,
        spans: document.querySelectorAll('.timeline .span').length,
        title: document.querySelector('h1 code').textContent,
        stray: [...app.childNodes].filter(n => n.nodeType === Node.TEXT_NODE).map(n => n.textContent),
    }))()""")
    i = next(i for i in range(N) if rollout_id(i) == rid)
    a, b = 100 + i % 50, 7 + i % 13
    assert shown["title"] == rid and shown["roles"] == ["system", "user", "assistant", "tool"]
    assert shown["user"] == f"What is {a} + {b}?" and shown["call"] == "add" and shown["result"] == str(a + b)
    assert json.loads(shown["args"]) == {"a": a, "b": b}
    assert shown["errorType"] == ("ToolsetError" if i % 2 else "ProviderError")
    assert f"rollout {i}" in shown["errorMessage"]
    assert shown["traceback"].startswith("Traceback (most recent call last)")
    assert shown["stray"] == []  # every section is an element: no "null" or "undefined" text
    assert shown["siblings"] == 4 and rid.startswith(shown["current"].rstrip("…")) and shown["spans"] >= 5


async def check_hostile_text_stays_text(page: Page) -> None:
    await page.evaluate(f"location.hash = '#/run/arith/rollout/{rollout_id(1)}'")
    assert await page.wait_for(f"document.querySelector('h1 code')?.textContent === {js(rollout_id(1))}")
    assert await page.evaluate("document.querySelector('.bubble.user .text').textContent") == HOSTILE
    assert await page.evaluate(
        "[window.__xss === undefined, document.querySelectorAll('.chat img, .chat script').length]"
    ) == [True, 0]


async def scenario(runs: Path, shot: Path, profile: Path) -> None:
    runner, url = await start(Viewer([runs], plot=plot))
    browser = await Browser.launch(CHROMIUM, profile)  # type: ignore[arg-type]
    try:
        page = await browser.page()
        try:
            await page.send(
                "Emulation.setDeviceMetricsOverride", width=1280, height=1000, deviceScaleFactor=1, mobile=False
            )
            rid = await open_failed_rollout(page, url)
            await check_rollout_page(page, rid)
            await page.screenshot(shot)
            await check_hostile_text_stays_text(page)
            await page.evaluate("document.querySelectorAll('#crumbs a')[1].click()")  # back to the run
            assert await page.wait_for(
                "app.dataset.view === 'run' && document.querySelector('#filters select[name=ok]').value === 'false'"
            )  # the filter kept
            assert page.errors == []
        finally:
            await page.close()
    except BaseException:
        print("chromium log:\n" + "".join(browser.log))
        raise
    finally:
        await browser.close()
        await runner.cleanup()
    assert group_members(browser.proc.pid) == []  # no chromium helper outlives the test


def test_filter_to_failed_rollouts_open_one_and_see_its_conversation_and_error(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_run(runs / "arith", N, rows_per_shard=10)
    write_run(runs / "other", 4, run_id="other")
    shot = Path(os.environ.get("ROLLOUT_RAY_SCREENSHOT") or tmp_path / "viewer.png")
    asyncio.run(scenario(runs, shot, tmp_path / "profile"))
    assert shot.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("ROLLOUT_RAY_UPDATE_SCREENSHOT") == "1":
        (REPO / "docs").mkdir(exist_ok=True)
        shutil.copyfile(shot, REPO / "docs" / "viewer.png")


async def models_shown(runs: Path, profile: Path) -> dict[str, object]:
    runner, url = await start(Viewer([runs]))
    browser = await Browser.launch(CHROMIUM, profile)  # type: ignore[arg-type]
    try:
        page = await browser.page()
        try:
            await page.navigate(url)
            assert await page.wait_for("document.querySelectorAll('a.run-link').length === 2")
            listed = await page.evaluate(
                "Object.fromEntries([...document.querySelectorAll('table.runs tbody tr')]"
                ".map(r => [r.cells[0].textContent, r.cells[4].textContent]))"
            )
            await page.evaluate("location.hash = '#/run/served'")
            assert await page.wait_for("app.dataset.view === 'run' && app.dataset.state === 'ready'")
            header = await page.evaluate(
                "[...document.querySelectorAll('.facts div')].find("
                "d => d.querySelector('dt').textContent === 'model').querySelector('dd')"
                ".textContent"
            )
            assert page.errors == []
            return {"listed": listed, "header": header}
        finally:
            await page.close()
    finally:
        await browser.close()
        await runner.cleanup()


def test_the_runs_list_and_the_run_header_show_the_model_by_name_and_where_it_is_served(tmp_path: Path) -> None:
    """Issue 34 §5: the manifest's model is a record; both printed it as ``[object Object]``."""
    runs = tmp_path / "runs"
    write_run(
        runs / "served",
        4,
        config={"taskset": "t.py", "model": {"url": "http://127.0.0.1:8000/v1", "name": "Qwen/Qwen3-8B"}},
    )
    write_run(runs / "simulated", 4, config={"taskset": "t.py", "model": {"simulated": {"model_name": "sim-7b"}}})
    shown = asyncio.run(models_shown(runs, tmp_path / "profile"))
    assert shown == {
        "listed": {
            "served": "Qwen/Qwen3-8B at http://127.0.0.1:8000/v1",
            "simulated": "sim-7b at the built-in simulated model server",
        },
        "header": "Qwen/Qwen3-8B at http://127.0.0.1:8000/v1",
    }
