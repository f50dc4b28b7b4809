"""An ``openai`` SDK tool loop on the Responses API (``POST /v1/responses``), run unchanged as
a ProgramHarness agent against a real vLLM through the proxy: it resends the whole input each
turn, as Codex does (no ``previous_response_id``). The tiny random model writes no tool call
of its own, so the first two turns force one (``tool_choice: "required"``) and the last
leaves the choice to it (``"auto"``: plain text, sampled without a grammar).
``python -W error responses_tools.py [stream]``: any warning of the SDK's fails it."""

import json
import os
import sys

import openai

TOOLS = [
    {
        "type": "function",
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    }
]
CHOICES = ["required", "required", "auto"]


def add(arguments: str) -> str:
    try:  # the random model's arguments are junk: the tool says so, as a real one would
        given = json.loads(arguments)
        return str(int(given["a"]) + int(given["b"]))
    except (ValueError, TypeError, KeyError) as e:
        return f"error: {type(e).__name__}"


stream = sys.argv[1:] == ["stream"]
with open(os.environ["ROLLOUT_RAY_INPUT"]) as f:
    items = [{"role": "user", "content": m["content"]} for m in json.load(f)["messages"] if m["role"] == "user"]
with openai.OpenAI(max_retries=0) as client:
    for choice in CHOICES:
        asked = {
            "model": "tiny",
            "instructions": "Use the tools.",
            "input": items,
            "tools": TOOLS,
            "tool_choice": choice,
            "max_output_tokens": 64,
        }
        if stream:
            # The last event holds the response: `response.completed`, or `response.incomplete`
            # for a reply cut at max_output_tokens (the SDK's stream helper only takes the former).
            with client.responses.create(**asked, stream=True) as events:
                ends = [e.response for e in events if e.type in ("response.completed", "response.incomplete")]
            (reply,) = ends
        else:
            reply = client.responses.create(**asked)
        items += [item.model_dump(exclude_none=True) for item in reply.output]
        items += [
            {"type": "function_call_output", "call_id": item.call_id, "output": add(item.arguments)}
            for item in reply.output
            if item.type == "function_call"
        ]
print(json.dumps([item.type for item in reply.output]))
