"""An ``anthropic`` SDK tool loop, run unchanged as a ProgramHarness agent: the SDK reads
ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY and speaks Messages to the proxy, streamed. Run with
``python -W error`` so any warning of the SDK's fails it."""

import json
import os
import re

import anthropic

TOOLS = [
    {
        "name": "calculator",
        "description": "Evaluate a product of two integers, such as 17*3.",
        "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}},
    }
]


def calculator(expression: str) -> str:
    a, b = map(int, re.fullmatch(r"\s*(\d+)\s*\*\s*(\d+)\s*", expression).groups())
    return str(a * b)


with open(os.environ["ROLLOUT_RAY_INPUT"]) as f:
    messages = [m for m in json.load(f)["messages"] if m["role"] == "user"]
with anthropic.Anthropic(max_retries=0) as client:
    for _ in range(4):
        with client.messages.stream(
            model="simulated", max_tokens=200, system="Use the calculator.", messages=messages, tools=TOOLS
        ) as stream:
            reply = stream.get_final_message()
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        calls = [b for b in reply.content if b.type == "tool_use"]
        if not calls:
            break
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": c.id, "content": calculator(**c.input)} for c in calls
                ],
            }
        )
print(reply.content[-1].text)
