"""The real-agent presets pass the task's whole conversation: its system prompt as the agent's
instructions (Codex's ``developer_instructions``, Claude Code's ``--append-system-prompt``,
mini-swe-agent's system template, the Agents SDK's ``instructions``) and a prior conversation
as the agent's prompt (a transcript; the Agents SDK's input items, turn by turn).

The plan the simulated model follows is only in the system prompt, so the file it makes the
agent write proves the instructions reached the model; the model's requests, on the trace, show
they came as instructions (not pasted into the prompt) and that the earlier turns came too. One
rollout per agent in a ``SandboxRuntime`` (nothing the agent sends leaves the machine), no Ray.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_rig import install_or_skip, sandboxed_rollout

from rollout_ray import Runtime, Task, reward
from rollout_ray._harnesses.agent_programs import task_prompt
from rollout_ray._harnesses.agents import (
    AgentHarness,
    AgentsSdkHarness,
    ClaudeCodeHarness,
    CodexHarness,
    MiniSweAgentHarness,
)
from rollout_ray._record.messages import AssistantMessage, text_of
from rollout_ray._runtimes.sandbox import sandbox_unavailable

SYSTEM = (
    "You keep your work under out/ (marker: instructions-7f3).\n"
    "RUN: mkdir -p out && echo from-the-instructions > out/system.txt\n"
    "ANSWER: done as instructed"
)
PRIOR = [
    {"role": "user", "content": "Remember the code word PELICAN."},
    {"role": "assistant", "content": "I will remember PELICAN."},
    {"role": "user", "content": "Now do what your instructions say."},
]
REASON = sandbox_unavailable(disk_limit=False)


class Continued(Task):
    @reward
    async def instructions_followed(self, runtime: Runtime) -> float:
        try:
            return float((await runtime.read("out/system.txt")).decode().strip() == "from-the-instructions")
        except Exception:  # noqa: BLE001 - no such file: the plan, only in the instructions, never ran
            return 0.0


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(REASON is not None, reason=f"no sandbox on this machine: {REASON}")
@pytest.mark.parametrize(
    ("make", "native"),
    [
        pytest.param(CodexHarness, False, id="codex"),
        pytest.param(ClaudeCodeHarness, False, id="claude-code"),
        pytest.param(MiniSweAgentHarness, False, id="mini-swe-agent"),
        pytest.param(AgentsSdkHarness, True, id="agents-sdk"),
    ],
)
def test_an_agent_gets_the_system_prompt_as_instructions_and_the_prior_turns(
    make: type[AgentHarness], native: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = make(timeout=180)
    install_or_skip(harness, monkeypatch)
    trace = sandboxed_rollout(Continued({"prompt": PRIOR, "system_prompt": SYSTEM}), harness, tmp_path)

    assert trace.errors == [] and trace.ok, trace.errors
    assert trace.rewards["instructions_followed"].score == 1.0  # the plan only the instructions held
    sent = [m for m in trace.messages if not isinstance(m, AssistantMessage) or m.content != "done as instructed"]
    instructions = [m for m in sent if m.role in ("system", "developer") and "instructions-7f3" in text_of(m.content)]
    assert instructions, [m.role for m in sent]
    user_text = "\n".join(text_of(m.content) for m in sent if m.role == "user")
    assert "instructions-7f3" not in user_text  # instructions, not pasted into the prompt
    for turn in PRIOR:
        assert turn["content"] in "\n".join(text_of(m.content) for m in sent)
    earlier_reply = [m for m in trace.messages if m.role == "assistant" and m.content == PRIOR[1]["content"]]
    assert bool(earlier_reply) == native  # the SDK's turn as a turn; the others' in the transcript
    if make is not MiniSweAgentHarness:  # it ends on its submit command, not on a text answer
        assert trace.last_reply == "done as instructed"


def test_one_user_message_is_the_prompt_unchanged_and_instructions_are_apart() -> None:
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "RUN: ls\n-x"}]
    assert task_prompt.prompt(conversation) == "RUN: ls\n-x"
    assert task_prompt.instructions(conversation) == "Be brief."
    assert task_prompt.instructions([{"role": "user", "content": "hi"}]) == ""


def test_a_prior_conversation_is_rendered_with_its_tool_calls_and_results() -> None:
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Use the shell."}]},
        {"role": "user", "content": [{"type": "text", "text": "List the files."}, {"type": "image_url"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": '{"c":1}'}}],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "a.txt"},
        {"role": "assistant", "content": "There is a.txt."},
        {"role": "user", "content": "Delete it."},
    ]
    assert task_prompt.instructions(conversation) == "Be brief.\n\nUse the shell."
    assert task_prompt.prompt(conversation) == (
        "The conversation so far:\n\n"
        "[user]\nList the files.\n[image_url]\n\n"
        '[assistant]\n[tool call call_0: bash({"c":1})]\n\n'
        "[tool result call_0]\na.txt\n\n"
        "[assistant]\nThere is a.txt.\n\n"
        "[user, now]\nDelete it."
    )
    # a conversation that ends on the agent's side (a resume with no new message) asks it to go on
    assert task_prompt.prompt(conversation[:-1]).endswith("[user, now]\nContinue from the conversation above.")
