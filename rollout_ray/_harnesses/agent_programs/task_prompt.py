"""The rollout's conversation as an agent takes it (standard library only; shipped beside every
launcher, which imports it from its own directory).

``ROLLOUT_RAY_INPUT`` holds OpenAI chat messages: on launch the task's system prompt and its
prompt (one user message, or a prior conversation), on resume the conversation so far plus the
new user messages. A command-line agent takes one prompt and, at most, instructions; so the
system and developer messages become its instructions (``instructions``) and the rest its prompt
(``prompt``): the last user message's text alone when it is the whole conversation, otherwise a
transcript of the turns before it (tool calls and results included), then that message.
"""

import json
import os
from typing import Any

INSTRUCTIONS_ROLES = ("system", "developer")


def messages() -> list[dict[str, Any]]:
    """The messages of ``ROLLOUT_RAY_INPUT``."""
    with open(os.environ["ROLLOUT_RAY_INPUT"]) as f:
        found: list[dict[str, Any]] = json.load(f)["messages"]
    return found


def text(content: Any) -> str:
    """A message's content as text: its text parts joined, an image part as ``[image]``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(str(p.get("text", "")) if p.get("type") == "text" else f"[{p.get('type')}]" for p in content)


def instructions(conversation: list[dict[str, Any]]) -> str:
    """The system and developer messages' text, in order, a blank line apart."""
    return "\n\n".join(text(m.get("content")) for m in conversation if m.get("role") in INSTRUCTIONS_ROLES)


def turns(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation without its system and developer messages."""
    return [m for m in conversation if m.get("role") not in INSTRUCTIONS_ROLES]


def _block(message: dict[str, Any]) -> str:
    role = message.get("role")
    body = text(message.get("content"))
    if role == "tool":
        return f"[tool result {message.get('tool_call_id', '')}]\n{body}"
    calls = [
        f"[tool call {c.get('id', '')}: {c['function']['name']}({c['function'].get('arguments', '')})]"
        for c in message.get("tool_calls") or ()
    ]
    return "\n".join([f"[{role}]", *([body] if body else []), *calls])


def prompt(conversation: list[dict[str, Any]]) -> str:
    """The conversation's turns as one prompt (see the module docstring)."""
    rest = turns(conversation)
    if not rest:
        return ""
    last = rest[-1]
    if last.get("role") == "user" and len(rest) == 1:
        return text(last.get("content"))  # the common case: the task's prompt, unchanged
    ends_on_user = last.get("role") == "user"
    earlier = rest[:-1] if ends_on_user else rest
    transcript = "\n\n".join(_block(m) for m in earlier)
    now = text(last.get("content")) if ends_on_user else "Continue from the conversation above."
    return f"The conversation so far:\n\n{transcript}\n\n[user, now]\n{now}"
