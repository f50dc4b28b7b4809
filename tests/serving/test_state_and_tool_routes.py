"""The proxy's ``/state`` (§5.4) and ``/tool`` (§5.3) routes over real HTTP, as upstream's:
``GET`` / ``PUT /state`` under the state secret read and replace ``trace.state`` (validated
into the task's ``state_type``); ``POST /tool`` under the model secret is the harness's tool
gate, judged by the task's request ``@intercept`` / ``@stop`` hooks."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from pydantic import BaseModel

from rollout_ray import HTTPInterception, Request, RolloutSession, Task, ToolMessage, Trace, intercept, stop
from rollout_ray._core.hooks import classify
from rollout_ray._core.interception import Slot
from rollout_ray._core.state import initial_state
from rollout_ray.testing import Reply, ScriptedModel


class Counter(BaseModel):
    count: int = 0
    seen: list[str] = []


class CountingTask(Task):
    state_type = Counter

    @intercept
    def forbid_rm(self, request: Request) -> Request | None:
        last = request.messages[-1]
        if isinstance(last, ToolMessage) and last.name == "rm":
            return Request([*request.messages[:-1], ToolMessage(last.tool_call_id, "rm is not allowed", last.name)])
        return None

    @stop
    def on_shutdown(self, request: Request) -> bool:
        last = request.messages[-1]
        return isinstance(last, ToolMessage) and last.name == "shutdown"


def _session(model: ScriptedModel) -> RolloutSession:
    task = CountingTask({"prompt": "count"})
    trace = Trace(task=task.trace_task(), state=initial_state(task.state_type))
    return RolloutSession(trace, model, state_type=task.state_type, **classify(task))


Check = Callable[[aiohttp.ClientSession, Slot], Awaitable[Any]]


def _serve(session: RolloutSession, check: Check) -> Any:
    async def main() -> Any:
        async with HTTPInterception() as server, aiohttp.ClientSession() as client:
            async with server.serve(session) as slot:
                return await check(client, slot)

    return asyncio.run(main())


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_state_is_read_and_replaced_under_the_state_secret_and_validated_into_the_state_type() -> None:
    session = _session(ScriptedModel(default="ok"))

    async def check(client: aiohttp.ClientSession, slot: Slot) -> list[Any]:
        url, ok = f"{slot.base_url}/state", _bearer(slot.state_secret)
        seen: list[Any] = []
        async with client.get(url, headers=ok) as r:
            seen.append((r.status, await r.json()))
        async with client.put(url, headers=ok, json={"count": 2, "seen": ["a"]}) as r:
            seen.append((r.status, await r.json()))
        async with client.get(url, headers=ok) as r:
            seen.append((r.status, await r.json()))
        async with client.put(url, headers=ok, json={"count": "many"}) as r:
            seen.append((r.status, (await r.json())["error"]["message"]))
        for wrong in (_bearer(slot.model_secret), _bearer("nope"), {}):  # the model key is not the state key
            async with client.get(url, headers=wrong) as r:
                seen.append(r.status)
            async with client.put(url, headers=wrong, json={"count": 9}) as r:
                seen.append(r.status)
        return seen

    seen = _serve(session, check)
    assert seen[:3] == [(200, {"count": 0, "seen": []}), (200, {"ok": True}), (200, {"count": 2, "seen": ["a"]})]
    assert seen[3][0] == 400 and seen[3][1].startswith("invalid state for Counter: ")
    assert seen[4:] == [401] * 6
    assert session.trace.state == {"count": 2, "seen": ["a"]}  # the refused writes left it as it was


def test_untyped_state_takes_any_json_object_and_refuses_anything_else() -> None:
    model = ScriptedModel(default="ok")
    session = RolloutSession(Trace(task=Task({"prompt": "p"}).trace_task()), model)

    async def check(client: aiohttp.ClientSession, slot: Slot) -> list[Any]:
        url, ok = f"{slot.base_url}/state", _bearer(slot.state_secret)
        out = []
        for body in (b'{"a": [1, {"b": null}]}', b"[1, 2]", b"{not json"):
            async with client.put(url, headers=ok, data=body) as r:
                out.append((r.status, await r.json()))
        return out

    (first, array, garbage) = _serve(session, check)
    assert first == (200, {"ok": True}) and session.trace.state == {"a": [1, {"b": None}]}
    assert array[0] == 400 and array[1]["error"]["message"].endswith("send a JSON object, got list")
    assert garbage[0] == 400 and "not JSON" in garbage[1]["error"]["message"]


def test_the_tool_gate_allows_denies_and_stops_by_the_tasks_request_hooks() -> None:
    calls = [("ls", {"path": "."}), ("rm", {"path": "/"})]
    session = _session(ScriptedModel([Reply(tool_calls=calls)], default="done"))

    async def check(client: aiohttp.ClientSession, slot: Slot) -> list[Any]:
        model = _bearer(slot.model_secret)
        body = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
        async with client.post(f"{slot.base_url}/v1/chat/completions", headers=model, json=body) as r:
            made = [c["id"] for c in (await r.json())["choices"][0]["message"]["tool_calls"]]
        gate = f"{slot.base_url}/tool"
        out: list[Any] = []
        asks = [
            {"tool_call_id": made[0], "name": "ls", "arguments": {"path": "."}},
            {"tool_call_id": made[1], "name": "rm", "arguments": {"path": "/"}},
            {"tool_call_id": "gate-7", "name": "rm", "arguments": '{"path": "/"}'},  # its own id: by name and args
            {"tool_call_id": "script_1", "name": "shutdown", "arguments": {}},  # a call the model never made
            {"tool_call_id": made[0], "name": "ls", "arguments": {"path": "."}},  # stopped now
        ]
        for ask in asks:
            async with client.post(gate, headers=model, json=ask) as r:
                out.append((r.status, await r.json()))
        async with client.post(gate, headers=_bearer(slot.state_secret), json=asks[0]) as r:
            out.append(r.status)  # the state key is not the model key
        return out

    allow, deny, deny_by_arguments, stop_now, stopped, wrong = _serve(session, check)
    assert deny_by_arguments == deny
    assert allow == (200, {"action": "allow"})
    assert deny[0] == 200 and deny[1]["action"] == "deny"
    assert deny[1]["message"]["role"] == "tool" and deny[1]["message"]["content"] == "rm is not allowed"
    assert stop_now == (200, {"action": "stop", "reason": "on_shutdown"})
    assert stopped == (200, {"action": "stop", "reason": "on_shutdown"})
    assert wrong == 401
    assert session.trace.stop_condition == "on_shutdown"
    assert [r.handler for r in session.trace.request_rewrites] == ["forbid_rm", "forbid_rm"]


def test_a_gate_question_that_matches_no_call_is_a_harness_error_on_the_rollout() -> None:
    session = _session(ScriptedModel(default="plain"))

    async def check(client: aiohttp.ClientSession, slot: Slot) -> tuple[int, Any]:
        async with client.post(
            f"{slot.base_url}/tool", headers=_bearer(slot.model_secret), json={"tool_call_id": "x"}
        ) as r:
            return r.status, await r.json()

    status, body = _serve(session, check)
    assert status == 400 and "tool gate asked about 'x'" in body["error"]["message"]
    assert type(session.error).__name__ == "HarnessError"
