"""The viewer shows a real agent's run (issue 29): one Codex CLI rollout (the package's preset,
driven by the simulated model's plan, in a ``SandboxRuntime``: nothing it sends leaves the
machine), stored as a run, read back through the API and in headless Chromium: the prompt,
Codex's ``exec_command`` calls with their arguments, their results named by the tool they
answer (Responses leaves the name off), the final reply. A copy of it continued in a compacted
context (as Codex or Claude Code do on a long task) shows that branch with its reason, and the
branch it left folded beside it, its tool calls included."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from agent_rig import install_or_skip, sandboxed_rollout
from cdp import Browser, find_chromium
from viewer_runs import get, rollout_id, write_run

from rollout_ray import CodexHarness, Task, Trace
from rollout_ray._record.graph import ConversationGraph
from rollout_ray._record.messages import AssistantMessage, UserMessage
from rollout_ray._record.trace import decode_trace, encode_trace
from rollout_ray._record.trace_parts import ModelCall
from rollout_ray._runtimes.sandbox import sandbox_unavailable
from rollout_ray._viewer.server import Viewer, start

REASON = sandbox_unavailable(disk_limit=False)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(REASON is not None, reason=f"no sandbox on this machine: {REASON}"),
]
COMMANDS = ["mkdir -p out && echo $((6*7)) > out/answer.txt", "printf '%s\\n' 'plan ran' > out/notes.md"]
PROMPT = f"Make the report.\nRUN: {COMMANDS[0]}\nWRITE: out/notes.md: plan ran\nANSWER: saved the report"
SUMMARY = "This session is being continued from a previous conversation. Summary: the report is saved."


class Report(Task):
    """The plan's files; no reward (the viewer is under test, not the agent)."""


def _compacted(trace: Trace) -> Trace:
    """The rollout continued in a compacted context: Codex's system messages, then the summary
    of what they led to, with the same tools (a new context, not a sub-agent)."""
    copy = decode_trace(encode_trace(trace))
    graph = ConversationGraph(copy)
    opening = [n.message for n in copy.nodes if n.message.role == "system"] + [UserMessage(SUMMARY)]
    node = graph.commit(opening, AssistantMessage("Nothing is left to do."))
    copy.calls.append(ModelCall(node=node, tools_digest=copy.calls[0].tools_digest))
    return copy


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    harness = CodexHarness(timeout=180)
    with pytest.MonkeyPatch.context() as monkeypatch:
        install_or_skip(harness, monkeypatch)
    trace = sandboxed_rollout(Report({"prompt": PROMPT}), harness, tmp_path_factory.mktemp("boxes"))
    assert trace.ok and trace.errors == [], trace.errors
    rows = [trace, _compacted(trace)]
    for i, row in enumerate(rows):
        row.id = rollout_id(i)
    root = tmp_path_factory.mktemp("runs")
    write_run(root / "codex", len(rows), shape=lambda i, _: rows[i])
    return root


def _tool_turns(messages: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    """(tool, command, name of the result that answers it) per call, in order."""
    results = {m["tool_call_id"]: m["name"] for m in messages if m["role"] == "tool"}
    return [
        (c["name"], json.loads(c["arguments"])["cmd"], results.get(c["id"]))
        for m in messages
        if m["role"] == "assistant"
        for c in m["tool_calls"]
    ]


def test_the_api_gives_the_agents_conversation_with_its_tool_calls_and_results(runs: Path) -> None:
    viewer = Viewer([runs])
    r = get(viewer, "/api/rollout", run="codex", id=rollout_id(0))
    messages = r["messages"]
    assert any(m["role"] == "user" and m["text"] == PROMPT for m in messages)
    assert _tool_turns(messages) == [("exec_command", c, "exec_command") for c in COMMANDS]
    assert [m["sampled"] for m in messages if m["role"] == "assistant"] == [True, True, True]
    assert messages[-1]["role"] == "assistant" and messages[-1]["text"] == "saved the report"
    assert (r["num_branches"], r["branch_reasons"], r["other_branches"]) == (1, ["main"], [])

    compacted = get(viewer, "/api/rollout", run="codex", id=rollout_id(1))
    assert compacted["branch_reasons"] == ["main", "compaction"]
    shared = [m for m in messages if m["role"] == "system"]  # Codex's instructions, then its skills'
    assert compacted["messages"][: len(shared)] == shared
    assert [m["text"] for m in compacted["messages"][len(shared) :]] == [SUMMARY, "Nothing is left to do."]
    (left,) = compacted["other_branches"]
    assert (left["branch"], left["reason"], left["forks_after"]) == (0, "main", shared[-1]["node"])
    assert left["messages"] == messages[len(shared) :]  # what the compaction replaced, tool turns included


async def _page(url: str, profile: Path) -> dict[str, Any]:
    chromium = find_chromium()
    assert chromium is not None
    browser = await Browser.launch(chromium, profile)
    try:
        page = await browser.page()
        try:
            await page.navigate(url + f"#/run/codex/rollout/{rollout_id(1)}")
            assert await page.wait_for("app.dataset.view === 'rollout' && app.dataset.state === 'ready'")
            shown: dict[str, Any] = await page.evaluate("""(() => {
                const block = document.querySelector('.block.conversation');
                const bubbles = (chat) => [...chat.children].map(b => [
                    b.querySelector('.role').textContent,
                    [...b.querySelectorAll(':scope > .toolcall code')].map(c => c.textContent)]);
                return {
                    title: block.querySelector('h2').textContent,
                    shown: bubbles(block.querySelector(':scope > .chat')),
                    folded: [...block.querySelectorAll('.other-branch')].map(d => [
                        d.querySelector('summary').textContent, d.open, bubbles(d.querySelector('.chat'))]),
                };
            })()""")
            assert page.errors == []
            return shown
        finally:
            await page.close()
    finally:
        await browser.close()


@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary (Debian: apt-get install chromium)")
def test_the_page_shows_the_branch_and_folds_the_one_it_left_with_the_tool_turns(runs: Path, tmp_path: Path) -> None:
    async def main() -> dict[str, Any]:
        runner, url = await start(Viewer([runs]))
        try:
            return await _page(url, tmp_path / "profile")
        finally:
            await runner.cleanup()

    shown = asyncio.run(main())
    assert shown["title"] == "Conversation (4 messages, branch 1 of 2: compaction)"
    assert shown["shown"] == [["system", []], ["system", []], ["user", []], ["assistant", []]]
    ((summary, is_open, folded),) = shown["folded"]
    assert summary.startswith("branch 0 (main) · leaves the shown branch after #1 · ") and not is_open
    calls = [(role, names) for role, names in folded if names or role.startswith("tool")]
    assert calls == [
        ("assistant", ["exec_command"]),
        ("tool result: exec_command", []),
        ("assistant", ["exec_command"]),
        ("tool result: exec_command", []),
    ]
