"""A model that speaks the simulated server's chat template, and a tool rollout through a session:
realistic token records, with or without template drift."""

from __future__ import annotations

from typing import Any

import msgspec

from rollout_ray import (
    AssistantMessage,
    Request,
    Response,
    RolloutSession,
    SystemMessage,
    Tool,
    ToolCall,
    ToolMessage,
    Trace,
    TraceTask,
    UserMessage,
)
from rollout_ray._core.model import Model
from rollout_ray._record.openai_codec import wire_message
from rollout_ray._simulated.template import body, render
from rollout_ray._simulated.tokenizer import IM_END, encode
from rollout_ray.testing import run_virtual

ADD = Tool("add", "Add two integers.", {"type": "object", "properties": {"a": {"type": "integer"}}})
SYSTEM = SystemMessage("Use the tool.")
USER = UserMessage("What is 1 + 2 + 3?")


def _call(i: int) -> ToolCall:
    return ToolCall(f"call_{i}", "add", '{"a": 1, "b": 2}')


def wire(message: Any) -> dict[str, Any]:
    return msgspec.to_builtins(wire_message(message))


class TemplateModel(Model):
    """Answers with scripted replies, and with the ids and logprobs the simulated server's
    chat template gives them (``drift``: its template-drift mode)."""

    def __init__(self, replies: list[AssistantMessage], *, drift: bool = False, policy: int | None = 7) -> None:
        self.replies, self.drift, self.policy = list(replies), drift, policy
        self.prompts: list[list[int]] = []

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Response:
        tools = [{"type": "function", "function": msgspec.to_builtins(t)} for t in request.tools or ()]
        prompt = render([wire(m) for m in request.messages], tools or None, drift=self.drift)
        self.prompts.append(prompt)
        reply = self.replies.pop(0)
        ids = [*encode(body(wire(reply))), IM_END]
        logprobs = [-(len(self.prompts) + k / 100) for k in range(len(ids))]
        return Response(
            reply, prompt_token_ids=prompt, token_ids=ids, token_logprobs=logprobs, policy_version=self.policy
        )


REPLIES = [
    AssistantMessage(None, tool_calls=[_call(0)]),
    AssistantMessage("Then 3 + 3.", tool_calls=[_call(1)]),
    AssistantMessage("The answer is 6."),
]


def tool_rollout(model: Model, **kwargs: Any) -> Trace:
    """Three turns: a tool call, another, and the answer, as a tool-calling harness sends them."""
    session = RolloutSession(Trace(task=TraceTask(type="T")), model, **kwargs)
    messages: list[Any] = [SYSTEM, USER]
    for i in range(3):
        reply = run_virtual(session.chat(Request(list(messages), [ADD]))).message
        messages.append(reply)
        if reply.tool_calls:
            messages.append(ToolMessage(f"call_{i}", "3" if i == 0 else "6"))
        else:
            messages.append(UserMessage("Go on."))
    return session.trace
