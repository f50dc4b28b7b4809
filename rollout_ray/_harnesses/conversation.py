"""The conversation a harness opens or resumes: the task's prompt, or the trace plus new turns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from .._core.harness import HarnessContext
from .._record.agent_branches import agent_messages
from .._record.messages import Message, SystemMessage, UserMessage
from .._record.openai_codec import wire_message


def wire_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Our message structs as OpenAI chat message dicts."""
    return [msgspec.to_builtins(wire_message(m)) for m in messages]


def opening_messages(ctx: HarnessContext) -> list[dict[str, Any]]:
    """The system prompt (if any) then the task prompt, as OpenAI chat message dicts."""
    system, prompt = ctx.data.system_prompt, ctx.data.prompt
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    elif prompt is not None:
        messages.extend(prompt)
    return messages


def resumed_messages(ctx: HarnessContext, new: Sequence[Message]) -> list[dict[str, Any]]:
    """The trace's last branch plus ``new``; the system prompt opens a conversation yet empty."""
    history = wire_messages(agent_messages(ctx.trace))  # its own branch, not a peer agent's
    if not history and ctx.data.system_prompt:
        history = [{"role": "system", "content": ctx.data.system_prompt}]
    return history + wire_messages(new)


def opening(ctx: HarnessContext) -> list[Message]:
    """``opening_messages`` as message structs (for an in-process agent)."""
    system, prompt = ctx.data.system_prompt, ctx.data.prompt
    if isinstance(prompt, str):  # the common case, built directly: converting costs ~12 us
        return [SystemMessage(system), UserMessage(prompt)] if system else [UserMessage(prompt)]
    return msgspec.convert(opening_messages(ctx), list[Message])


def resumed(ctx: HarnessContext, new: Sequence[Message]) -> list[Message]:
    """``resumed_messages`` as message structs (for an in-process agent)."""
    history = agent_messages(ctx.trace)  # its own branch, not a peer agent's
    if not history and ctx.data.system_prompt:
        history = msgspec.convert([{"role": "system", "content": ctx.data.system_prompt}], list[Message])
    return [*history, *new]
