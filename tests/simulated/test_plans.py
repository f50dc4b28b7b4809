"""The simulated model drives a coding agent with the task's scripted plan: over the real
server, a loop that runs each shell call it answers in a real ``bash`` leaves the plan's files,
whichever tool shape the agent offers (Codex's ``exec_command``, Claude Code's ``Bash`` and
``Write``, an argv ``shell``, mini-swe-agent's text protocol)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sim_client import serve

from rollout_ray._simulated.answers import respond
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.plans import FENCE, SUBMIT, follow, parse_plan

PLAN = "Make the report.\nRUN: mkdir -p out && echo $((6*7)) > out/answer.txt\nWRITE: out/notes.md: plan ran\nANSWER: all done"


def tool(name: str, **props: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props}}}


STRING = {"type": "string"}
CODEX = [tool("exec_command", cmd=STRING, login={"type": "boolean"}), tool("view_image", path=STRING)]
CLAUDE = [
    tool("Read", file_path=STRING),
    tool("Bash", command=STRING, description=STRING),
    tool("Write", file_path=STRING, content=STRING),
]
ARGV = [tool("shell", command={"type": "array", "items": STRING})]
MINI = [tool("bash", command=STRING)]  # mini-swe-agent 2.x's one tool; its prompt names its submit command


def _run(name: str, arguments: dict[str, Any], cwd: Path) -> str:
    if name in ("Write",):
        (cwd / arguments["file_path"]).write_text(arguments["content"])
        return "written"
    command = arguments.get("cmd") or arguments.get("command")
    argv = command if isinstance(command, list) else ["bash", "-c", command]
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


def _agent(tools: list[dict[str, Any]] | None, cwd: Path, system: str) -> tuple[list[dict[str, Any]], str]:
    """An agent loop against the real server: tool calls (or fenced commands) run for real."""

    async def body(server: Any, post: Any) -> tuple[list[dict[str, Any]], str]:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": PLAN},
            {"role": "user", "content": "<environment_context>cwd</environment_context>"},
        ]
        for _ in range(8):
            status, raw = await post({"model": "m", "messages": messages, **({"tools": tools} if tools else {})})
            assert status == 200, raw
            message = json.loads(raw)["choices"][0]["message"]
            messages.append(message)
            if message.get("tool_calls"):
                for call in message["tool_calls"]:
                    fn = call["function"]
                    if json.loads(fn["arguments"]).get("command") == SUBMIT:
                        return messages, "submitted"
                    out = _run(fn["name"], json.loads(fn["arguments"]), cwd)
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
                messages.append({"role": "user", "content": "<system-reminder>keep going</system-reminder>"})
                continue
            fenced = re.search(rf"```{FENCE}\n(.*)\n```", message["content"] or "", re.DOTALL)
            if fenced is None:
                return messages, message["content"]
            if fenced.group(1) == SUBMIT:
                return messages, "submitted"
            messages.append({"role": "user", "content": _run("bash", {"command": fenced.group(1)}, cwd)})
        raise AssertionError(f"the plan did not end: {messages}")

    return serve(body)


@pytest.mark.parametrize(
    ("tools", "system"),
    [(CODEX, ""), (CLAUDE, ""), (ARGV, ""), (MINI, f"End with `{SUBMIT}`."), (None, "One fenced command a turn.")],
    ids=["codex", "claude-code", "argv-shell", "mini-swe-agent", "text"],
)
def test_the_plan_is_carried_out_through_the_offered_tools(
    tools: list[dict[str, Any]] | None, system: str, tmp_path: Path
) -> None:
    messages, final = _agent(tools, tmp_path, system)
    assert (tmp_path / "out" / "answer.txt").read_text() == "42\n"
    assert (tmp_path / "out" / "notes.md").read_text() == "plan ran\n"
    assert final == ("submitted" if tools in (None, MINI) else "all done")
    if tools is CLAUDE:  # the file is written by the edit tool, not by the shell
        names = [c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()]
        assert names == ["Bash", "Write"]


def test_without_a_plan_the_policy_is_unchanged() -> None:
    assert parse_plan("What is 2+2? ANSWER: 4") is None
    assert follow([{"role": "user", "content": "What is 2+2?"}], CODEX) is None


def test_a_plan_in_one_part_of_a_message_ends_at_that_part() -> None:
    """Codex sends the task's instructions and its own skills' as two parts of one developer
    message; the plan's answer is the first part's line, not run into the second."""
    parts = [{"type": "text", "text": "RUN: true\nANSWER: all done"}, {"type": "text", "text": "<skills>...</skills>"}]
    messages: list[dict[str, Any]] = [{"role": "developer", "content": parts}, {"role": "user", "content": "go"}]
    first = follow(messages, CODEX)
    assert first is not None and first["tool_calls"][0]["function"]["arguments"] == '{"cmd": "true"}'
    messages += [first, {"role": "tool", "tool_call_id": "call_0", "content": ""}]
    assert follow(messages, CODEX) == {"role": "assistant", "content": "all done"}


def test_an_mcp_result_wrapped_by_the_agent_is_reported_as_its_value() -> None:
    config = SimulatedModelConfig(ttft=0, error_rate=0.0)
    messages = [
        {"role": "user", "content": "What is 101 + 23?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_0", "type": "function", "function": {"name": "mcp__calc__add", "arguments": "{}"}}
            ],
        },
    ]
    codex = 'Wall time: 0.0037 seconds\nOutput:\n{"result":124}'  # Codex's frame around an MCP result
    for content, reply in [
        ('{"result":124}', "124"),
        ('{"result": [1]}', '{"result": [1]}'),
        ("124", "124"),
        (codex, "124"),
        ("Output:\n124", "Output:\n124"),
    ]:
        answer = respond([*messages, {"role": "tool", "tool_call_id": "call_0", "content": content}], None, config, 1.0)
        assert answer["content"] == reply
