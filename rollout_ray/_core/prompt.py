"""The task data a harness sees: its prompt, rewritten once by request interceptors (B15)."""

from __future__ import annotations

from typing import Any

import msgspec

from .harness import Harness
from .interception import Interception
from .._record.messages import Message, Request, SystemMessage, UserMessage
from .session import RolloutSession
from .task import TaskData


async def harness_data(
    data: TaskData, harness: Harness, session: RolloutSession, interception: Interception
) -> TaskData:
    """A copy of ``data`` with the harness's resolved system prompt and prompt.

    When the task has request interceptors, the prompt's user turns go through them once
    (no stops), their records land on the trace, and the harness gets the rewritten prompt;
    a string prompt stays a string when one text turn remains. The trace's own task data is
    never changed.
    """
    system, prompt = harness.resolve_prompt(data)
    if prompt is None or not session.request_interceptors:
        return data.model_copy(update={"system_prompt": system, "prompt": prompt})
    if isinstance(prompt, str):
        messages: list[Message] = [UserMessage(prompt)]
    else:
        messages = msgspec.convert(prompt, list[Message])
        system = data.system_prompt
    if system is not None:
        messages.insert(0, SystemMessage(system))
    rewritten = await interception.prepare_users(session, Request(messages))
    # Strip only the system message added above; the prompt's own stay.
    kept = rewritten.messages[1:] if system is not None else list(rewritten.messages)
    new_prompt: Any
    if (
        isinstance(prompt, str)
        and len(kept) == 1
        and isinstance(kept[0], UserMessage)
        and isinstance(kept[0].content, str)
    ):
        new_prompt = kept[0].content
    else:
        new_prompt = msgspec.to_builtins(kept)
    return data.model_copy(update={"system_prompt": system, "prompt": new_prompt})
