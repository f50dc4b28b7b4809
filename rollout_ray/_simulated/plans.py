"""Scripted plans: how the simulated model drives a coding agent (Codex CLI, Claude Code,
mini-swe-agent, an Agents SDK program) with no real model behind it.

A task writes its plan into its prompt, one step a line::

    RUN: mkdir -p out && echo 42 > out/answer.txt
    WRITE: notes.md: the plan ran
    ANSWER: done

``RUN:`` is a shell command, ``WRITE: path: text`` a file to write (one line of text), ``ANSWER:``
the final text (default ``"done"``). When the request offers a shell-like tool (Codex's
``exec_command`` / ``shell``, Claude Code's ``Bash``, any tool named ``bash`` / ``shell``), the
model answers step k with a call of that tool (a ``WRITE`` goes to an edit tool taking a path and
a content when one is offered, else becomes a shell command), then the final text. Without a
tool, as mini-swe-agent's text protocol wants, step k is a fenced ``bash`` block of the command.
When the agent's prompt names mini-swe-agent's submit command, or with no tool, the plan's last
step is that command (mini-swe-agent ends on it, never on a plain answer). Step k is the number
of the model's own tool calls (or fenced commands) since the plan's message: the agent's own
extra user turns (environment notes, reminders, tool results sent as user turns) never restart
the plan.

Pure functions, no I/O, like ``answers.py``.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from .template import text_of

_STEP = re.compile(r"^\s*(RUN|WRITE|ANSWER):[ \t]?(.*)$", re.MULTILINE)
SHELL_NAMES = ("exec_command", "shell", "bash", "local_shell", "run_shell", "terminal")
EDIT_NAMES = ("write", "write_file", "create_file", "str_replace_based_edit_tool")
COMMAND_KEYS = ("cmd", "command", "script")
PATH_KEYS = ("file_path", "path", "filename")
CONTENT_KEYS = ("content", "file_text", "text")
FENCE = "mswea_bash_command"
"""mini-swe-agent 2.x's fence for the one command of a text-protocol turn."""
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""The command mini-swe-agent ends an episode on (its output is the submission)."""
_FENCED = re.compile(r"```(?:" + FENCE + r"|bash)\s*\n")


def parse_plan(text: str) -> tuple[list[tuple[str, str]], str] | None:
    """``(steps, answer)`` of the plan in ``text`` (steps as ``("run" | "write", arg)``), or
    ``None`` when it has no ``RUN:`` / ``WRITE:`` line."""
    steps: list[tuple[str, str]] = []
    answer = "done"
    for kind, arg in _STEP.findall(text):
        if kind == "ANSWER":
            answer = arg.strip() or answer
        else:
            steps.append((kind.lower(), arg.strip()))
    return (steps, answer) if steps else None


def _functions(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    found = []
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            found.append(fn)
    return found


def _properties(fn: dict[str, Any]) -> dict[str, Any]:
    params = fn.get("parameters")
    props = params.get("properties") if isinstance(params, dict) else None
    return props if isinstance(props, dict) else {}


def _key(fn: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    props = _properties(fn)
    return next((k for k in keys if k in props), None)


def shell_tool(tools: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The offered tool that runs a shell command and the key of its command, if any."""
    for fn in _functions(tools):
        if fn["name"].lower() in SHELL_NAMES and _key(fn, COMMAND_KEYS) is not None:
            return fn
    return None


def edit_tool(tools: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The offered tool that writes a whole file (a path and a content), if any."""
    for fn in _functions(tools):
        if fn["name"].lower() in EDIT_NAMES and _key(fn, PATH_KEYS) and _key(fn, CONTENT_KEYS):
            return fn
    return None


def _shell_arguments(fn: dict[str, Any], command: str) -> str:
    key = _key(fn, COMMAND_KEYS)
    assert key is not None
    # Codex's older ``shell`` tool takes an argv; every other one a command line.
    value: Any = ["bash", "-lc", command] if _properties(fn)[key].get("type") == "array" else command
    return json.dumps({key: value})


def _write_command(path: str, content: str) -> str:
    return f"printf '%s\\n' {shlex.quote(content)} > {shlex.quote(path)}"


def _split_write(arg: str) -> tuple[str, str]:
    path, _, content = arg.partition(":")
    return path.strip(), content.strip()


def _lines_of(content: Any) -> str:
    """A message's text parts a line apart: an agent sends its instructions as several parts
    (Codex: the task's, then its skills'), and a plan's last line must not run into the next."""
    if isinstance(content, list):
        return "\n".join(text_of([p]) for p in content)
    return text_of(content)


def _plan_message(messages: list[dict[str, Any]]) -> tuple[int, tuple[list[tuple[str, str]], str]] | None:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") in ("user", "system", "developer"):
            plan = parse_plan(_lines_of(messages[i].get("content")))
            if plan is not None:
                return i, plan
    return None


def _done(messages: list[dict[str, Any]]) -> int:
    """Steps the model took since the plan: its tool calls, or its fenced commands."""
    n = 0
    for m in messages:
        if m.get("role") == "assistant":
            calls = m.get("tool_calls")
            n += len(calls) if isinstance(calls, list) and calls else len(_FENCED.findall(text_of(m.get("content"))))
    return n


def _asks_submit(messages: list[dict[str, Any]]) -> bool:
    """Whether the agent's own prompt says it ends on the submit command (mini-swe-agent's)."""
    word = SUBMIT.split()[-1]
    return any(word in text_of(m.get("content")) for m in messages if m.get("role") in ("system", "user"))


def follow(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The assistant message taking the plan's next step, or ``None`` when no plan applies
    (no plan in the conversation). ``call_<n>`` ids as ``answers.respond``."""
    found = _plan_message(messages)
    if found is None:
        return None
    index, (steps, answer) = found
    step = _done(messages[index + 1 :])
    shell, edit = shell_tool(tools), edit_tool(tools)
    if (shell is None and edit is None) or _asks_submit(messages):
        steps = [*steps, ("run", SUBMIT)]  # mini-swe-agent ends on it, never on a plain answer
    if shell is None and edit is None:
        if step >= len(steps):
            return {"role": "assistant", "content": answer}
        kind, arg = steps[step]
        command = _write_command(*_split_write(arg)) if kind == "write" else arg
        return {"role": "assistant", "content": f"THOUGHT: step {step + 1} of the plan.\n\n```{FENCE}\n{command}\n```"}
    if step >= len(steps):
        return {"role": "assistant", "content": answer}
    kind, arg = steps[step]
    if kind == "write" and edit is not None:
        path, content = _split_write(arg)
        name, arguments = (
            edit["name"],
            json.dumps({_key(edit, PATH_KEYS): path, _key(edit, CONTENT_KEYS): content + "\n"}),
        )
    elif shell is not None:
        name = shell["name"]
        arguments = _shell_arguments(shell, _write_command(*_split_write(arg)) if kind == "write" else arg)
    else:  # a RUN step with only an edit tool offered: the plan cannot go on
        return {"role": "assistant", "content": answer}
    n = sum(len(m.get("tool_calls") or ()) for m in messages if m.get("role") == "assistant")
    call = {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}
