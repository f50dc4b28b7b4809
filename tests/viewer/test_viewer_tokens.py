"""The rollout page's token view in headless Chromium (issue 34 §5): each training sequence's
ids coloured by loss mask, sampled logprobs as a heat scale read back from the screenshot's
pixels, turn and policy-version boundaries, and a branch per context (a compaction)."""

from __future__ import annotations

import asyncio
import colorsys
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cdp import Browser, find_chromium
from PIL import Image
from viewer_runs import make_trace, rollout_id, write_run

from rollout_ray import Trace
from rollout_ray._cli.view import run_tokenizer
from rollout_ray._record.graph import ConversationGraph
from rollout_ray._record.messages import AssistantMessage, Message, SystemMessage, UserMessage
from rollout_ray._record.tokens import record_tokens, token_sequences
from rollout_ray._record.trace_parts import ModelCall
from rollout_ray._simulated.tokenizer import token_text
from rollout_ray._viewer.server import Viewer, start

CHROMIUM = find_chromium()
pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no chromium binary (Debian: apt-get install chromium; .ci/run installs it when missing)",
    ),
    pytest.mark.timeout(180),
]
SYSTEM = SystemMessage(content="You are an agent.")
Q = UserMessage(content="What is 2+2?")


def turn(
    trace: Trace,
    graph: ConversationGraph,
    messages: list[Message],
    reply: str,
    prompt: list[int],
    completion: list[int],
    logprobs: list[float],
    versions: list[int],
) -> None:
    call = ModelCall(node=graph.commit(messages, AssistantMessage(content=reply)), policy=versions[0])
    record_tokens(
        trace,
        call,
        SimpleNamespace(
            policy_version=versions[0],
            token_ids=completion,
            token_logprobs=logprobs,
            prompt_token_ids=prompt,
            token_versions=versions,
        ),
    )
    trace.calls.append(call)


def with_tokens(i: int, trace: Trace) -> Trace:
    """Row 0: two turns of the main context (the second sampled across a weight update, 3 to
    4), then a compacted context carrying the summary, whose second turn drifted: two
    branches, three sequences."""
    if i != 0:
        return trace
    trace.nodes, trace.calls = [], []
    graph = ConversationGraph(trace)
    turn(trace, graph, [SYSTEM, Q], "4", [1, 2, 3], [10, 11], [-0.01, -3.0], [3, 3])
    summary = "The user asked for 2+2 and was answered 4; then asked to go on."
    turn(
        trace,
        graph,
        [SYSTEM, Q, AssistantMessage(content="4"), UserMessage(content="Summarize.")],
        summary,
        [1, 2, 3, 10, 11, 4, 5],
        [20, 21, 22, 23],
        [-0.5, -0.01, -2.0, -0.2],
        [3, 3, 4, 4],
    )
    compacted: list[Message] = [SYSTEM, UserMessage(content=f"Summary: {summary}")]
    turn(trace, graph, compacted, "OK", [1, 2, 6, 7], [30], [-0.01], [4])
    # the template re-tokenized the reply (30 became 9): drift, a new sequence of branch 1
    turn(
        trace,
        graph,
        [*compacted, AssistantMessage(content="OK"), UserMessage(content="Go on.")],
        "done",
        [1, 2, 6, 7, 9, 8],
        [40],
        [-0.01],
        [4],
    )
    return trace


async def view(url: str, shot: Path, profile: Path) -> dict[str, Any]:
    browser = await Browser.launch(CHROMIUM, profile)  # type: ignore[arg-type]
    try:
        page = await browser.page()
        try:
            await page.send(
                "Emulation.setDeviceMetricsOverride", width=1280, height=1000, deviceScaleFactor=1, mobile=False
            )
            await page.navigate(url + f"#/run/arith/rollout/{rollout_id(0)}")
            assert await page.wait_for("app.dataset.view === 'rollout' && app.dataset.state === 'ready'")
            await page.evaluate("document.querySelector('.block.tokens').scrollIntoView()")
            shown = await page.evaluate("""(() => ({
                heads: [...document.querySelectorAll('.sequence-head')].map(e => e.textContent),
                ids: [...document.querySelectorAll('.sequence')].map(s => [...s.querySelectorAll('.tok')]
                    .map(t => [Number(t.dataset.id), t.classList.contains('sampled') ? 1 : 0])),
                turns: document.querySelectorAll('.tok.turn-start').length,
                completions: [...document.querySelectorAll('.tok.completion-start')].map(t => Number(t.dataset.id)),
                policy: [...document.querySelectorAll('.tok.policy-change')].map(t => Number(t.dataset.id)),
                texts: [...document.querySelectorAll('.sequence')].map(s => [...s.querySelectorAll('.tok')]
                    .map(t => t.textContent)),
                boxes: Object.fromEntries([...document.querySelectorAll('.tok.sampled')].map(t => {
                    const r = t.getBoundingClientRect();
                    return [t.closest('.sequence').dataset.branch + ':' + t.dataset.id, [r.right - 1.5, r.top + 1.5]]; })),  // the padding: background, not glyph or border
            }))()""")
            await page.screenshot(shot)
            assert page.errors == []
            return shown
        finally:
            await page.close()
    finally:
        await browser.close()


def hue(pixel: tuple[int, ...]) -> float:
    return colorsys.rgb_to_hsv(*(c / 255 for c in pixel[:3]))[0] * 360


def shown_text(token_id: int) -> str:
    """A token as the page shows it on a run of the simulated model: its text, whitespace
    made visible, or its id where no text encodes to it."""
    try:
        return token_text(token_id).replace(" ", "·").replace("\n", "↵")
    except ValueError:
        return str(token_id)


@pytest.mark.parametrize("decoded", [False, True], ids=["ids", "text"])
def test_the_token_view_shows_each_sequence_by_loss_mask_logprob_turn_policy_and_branch(
    tmp_path: Path, decoded: bool
) -> None:
    """A served model's run shows ids; a run of the simulated model (as eval records it) shows
    each id's text, through the tokenizer ``rollout-ray view`` gives the viewer."""
    runs = tmp_path / "runs"
    model: Any = {"simulated": {"model_name": "sim"}} if decoded else {"url": "http://127.0.0.1:9/v1", "name": "m"}
    write_run(runs / "arith", 4, shape=with_tokens, config={"taskset": "t.py", "model": model})
    shot = Path(os.environ.get("ROLLOUT_RAY_SCREENSHOT_TOKENS") or tmp_path / "tokens.png")

    async def main() -> dict[str, Any]:
        runner, url = await start(Viewer([runs], tokenizer=run_tokenizer))
        try:
            return await view(url, shot, tmp_path / "profile")
        finally:
            await runner.cleanup()

    shown = asyncio.run(main())
    expected = token_sequences(with_tokens(0, make_trace(0)))
    assert shown["ids"] == [list(map(list, zip(s.input_ids, s.loss_mask))) for s in expected]
    show = shown_text if decoded else str
    assert shown["texts"] == [[show(i) for i in s.input_ids] for s in expected]
    assert ("<|im_start|>" in shown["texts"][0]) is decoded
    assert shown["heads"][0].startswith("sequence 0 · branch 0 (main) · 11 ids, 6 trained")
    assert shown["heads"][1].startswith("sequence 1 · branch 1 (compaction) · 5 ids, 1 trained")
    assert shown["heads"][2].startswith("sequence 2 · branch 1 (compaction) · after drift · 7 ids, 1 trained")
    assert shown["turns"] == 4 and shown["completions"] == [10, 20, 30, 40] and shown["policy"] == [22]
    image = Image.open(shot).convert("RGB")
    pixel = {k: image.getpixel((round(x), round(y))) for k, (x, y) in shown["boxes"].items()}
    assert hue(pixel["0:10"]) > 100 and hue(pixel["1:30"]) > 100  # p ≈ 0.99: green
    assert hue(pixel["0:11"]) < 15  # logprob -3: red
    assert hue(pixel["0:11"]) < hue(pixel["0:22"]) < hue(pixel["0:20"]) < hue(pixel["0:10"])  # by probability
