"""A program harness in the rollout's runtime that uses ``/state`` and the ``/tool`` gate
(§5.3, §5.4), over real HTTP: it asks the gate before each tool call the model made, runs
the allowed ones on the tool server, gives the model the denied one's rewritten result, and
logs each verdict into ``trace.state`` (read, then replaced); a reward reads the state."""

from __future__ import annotations

import asyncio
import sys

from calc_taskset import ArithWithDiv
from pydantic import BaseModel

from rollout_ray import LocalRuntime, Request, Rollout, ToolMessage, ToolServer, Trace, intercept, reward
from rollout_ray._harnesses.program import ProgramHarness
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray.testing import Reply, ScriptedModel

PROGRAM = r"""
import json, os, urllib.request

def http(url, body=None, key=None, method=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method or ("POST" if data else "GET"))
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", "Bearer " + key)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)

env = os.environ
base, key = env["OPENAI_BASE_URL"], env["OPENAI_API_KEY"]
state_url, state_key = env["ROLLOUT_RAY_STATE_URL"], env["ROLLOUT_RAY_STATE_SECRET"]
(calc,) = json.loads(env["ROLLOUT_RAY_TOOLS"]).values()
messages = json.load(open(env["ROLLOUT_RAY_INPUT"]))["messages"]
while True:
    message = http(base + "/chat/completions", {"model": "m", "messages": messages}, key)["choices"][0]["message"]
    messages.append(message)
    if not message.get("tool_calls"):
        break
    for call in message["tool_calls"]:
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        ask = {"tool_call_id": call["id"], "name": name, "arguments": json.loads(arguments)}
        verdict = http(env["ROLLOUT_RAY_TOOL_GATE"], ask, key)
        if verdict["action"] == "stop":
            raise SystemExit(0)
        if verdict["action"] == "deny":
            content = verdict["message"]["content"]
        else:
            content = http(calc + "/call", {"name": name, "arguments": arguments}, key)["content"]
        state = http(state_url, key=state_key)
        state["verdicts"].append(name + ":" + verdict["action"])
        http(state_url, state, state_key, method="PUT")
        messages.append({"role": "tool", "tool_call_id": call["id"], "name": name, "content": content})
"""


class Verdicts(BaseModel):
    verdicts: list[str] = []


class GatedArith(ArithWithDiv):
    state_type = Verdicts

    @intercept
    def no_div(self, request: Request) -> Request | None:
        last = request.messages[-1]
        if isinstance(last, ToolMessage) and last.name == "div" and last.content != "div is not allowed":
            return Request([*request.messages[:-1], ToolMessage(last.tool_call_id, "div is not allowed", "div")])
        return None

    @reward
    def logged(self, trace: Trace) -> float:
        return float(trace.state["verdicts"] == ["add:allow", "div:deny"])


class StatefulProgram(ProgramHarness):
    supports_tool_interception = True
    uses_state = True


def test_a_program_in_the_runtime_asks_the_gate_and_keeps_state_over_http() -> None:
    model = ScriptedModel([Reply(tool_calls=[("add", {"a": 1, "b": 2}), ("div", {"a": 1, "b": 0})]), "3"])
    harness = StatefulProgram([sys.executable, "agent.py"], files={"agent.py": PROGRAM}, timeout=60)

    async def main() -> Trace:
        async with HTTPInterception() as proxy, ToolServer(sessions=proxy.session_of_state) as tools:
            task = GatedArith({"prompt": "1+2?"})
            rollout = Rollout(
                task, harness, model=model, interception=proxy, tool_server=tools.serve, runtime_factory=LocalRuntime
            )
            return await rollout.run()

    trace = asyncio.run(main())
    assert trace.errors == [] and (trace.ok, trace.num_turns) == (True, 2), trace.errors
    assert trace.state == {"verdicts": ["add:allow", "div:deny"]}
    assert [(c.name, c.ok) for c in trace.tool_calls] == [("add", True)]  # the denied call never ran
    tool_results = [m for m in model.requests[1].messages if isinstance(m, ToolMessage)]
    assert [(m.name, m.content) for m in tool_results] == [("add", "3"), ("div", "div is not allowed")]
    assert [r.handler for r in trace.request_rewrites] == ["no_div"]
    assert trace.rewards["logged"].score == 1.0 and trace.rewards["correct"].score == 1.0
