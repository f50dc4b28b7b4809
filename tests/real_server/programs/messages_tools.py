"""An ``anthropic`` SDK tool loop (``POST /v1/messages``), run unchanged as a ProgramHarness
agent against a real vLLM through the proxy. Like Claude Code it sends ``role: "system"``
messages inside ``messages``: its environment after the first user turn, and a reminder after
a tool result. The tiny random model writes no tool call of its own, so the first two turns
force one (``tool_choice: {"type": "any"}``) and the last leaves the choice to it (``auto``:
plain text, sampled without a grammar).
``python -W error messages_tools.py [stream]``: any warning of the SDK's fails it."""

import json
import os
import sys

import anthropic

TOOLS = [
    {
        "name": "add",
        "description": "Add two integers.",
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    }
]
CHOICES = [{"type": "any"}, {"type": "any"}, {"type": "auto"}]
ENVIRONMENT = "Environment: working directory /work, platform linux."
REMINDER = "Reminder: answer with the sum."


def add(given: object) -> str:
    try:  # the random model's arguments are junk: the tool says so, as a real one would
        return str(int(given["a"]) + int(given["b"]))  # type: ignore[index]
    except (ValueError, TypeError, KeyError) as e:
        return f"error: {type(e).__name__}"


stream = sys.argv[1:] == ["stream"]
with open(os.environ["ROLLOUT_RAY_INPUT"]) as f:
    messages = [{"role": "user", "content": m["content"]} for m in json.load(f)["messages"] if m["role"] == "user"]
messages.append({"role": "system", "content": ENVIRONMENT})
with anthropic.Anthropic(max_retries=0) as client:
    for turn, choice in enumerate(CHOICES):
        asked = {
            "model": "tiny",
            "max_tokens": 64,
            "system": "Use the tools.",
            "messages": messages,
            "tools": TOOLS,
            "tool_choice": choice,
        }
        if stream:
            with client.messages.stream(**asked) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(**asked)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        calls = [b for b in reply.content if b.type == "tool_use"]
        if calls:
            results = [{"type": "tool_result", "tool_use_id": c.id, "content": add(c.input)} for c in calls]
            messages.append({"role": "user", "content": results})
        if turn == 0:
            messages.append({"role": "system", "content": REMINDER})
print(json.dumps([b.type for b in reply.content]))
