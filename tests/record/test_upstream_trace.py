"""Code written against verifiers v1's ``Trace`` reads ours: upstream's public members, read
from the installed ``verifiers`` package (the ``verifiers`` extra, part of ``test``), are on
ours or listed in docs/lifecycle.md as not applying; the shared ones give upstream's answers."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pydantic import BaseModel
from verifiers.v1 import graph as upstream_graph
from verifiers.v1 import trace as upstream_trace
from verifiers.v1 import types as upstream_types
from verifiers.v1.configs.agent import AgentConfig
from verifiers.v1.judge import JudgeResponse
from verifiers.v1.task import TaskData as UpstreamTaskData

from rollout_ray import (
    AssistantMessage,
    MessageNode,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Trace,
    TraceTask,
    Usage,
    UserMessage,
    decode_trace,
    encode_trace,
)

LIFECYCLE = Path(__file__).parents[2] / "docs" / "lifecycle.md"


def _public_members(cls: type[BaseModel]) -> set[str]:
    """Fields, properties and methods a user of ``cls`` reads, without pydantic's own."""
    return {n for n in dir(cls) if not n.startswith("_") and n not in dir(BaseModel)} | set(cls.model_fields)


def _not_applying() -> dict[str, set[str]]:
    """The upstream members docs/lifecycle.md's table says do not apply, by class."""
    text = LIFECYCLE.read_text()
    table = text[text.index('<a id="upstream-members"></a>') :]
    table = table[: table.index("\n\n", table.index("| --- |"))]
    out: dict[str, set[str]] = {"Trace": set(), "MessageNode": set()}
    for row in table.splitlines()[4:]:
        owner = "Trace"
        for name in re.findall(r"`([\w.*]+)`", row.split("|")[1]):
            owner, _, name = name.rpartition(".") if "." in name else (owner, "", name)
            out[owner].add(name)
    return out


@pytest.mark.parametrize(
    ("upstream", "ours"), [(upstream_trace.Trace, Trace), (upstream_graph.MessageNode, MessageNode)]
)
def test_every_upstream_member_is_ours_or_documented_as_not_applying(upstream: Any, ours: Any) -> None:
    documented = _not_applying()[upstream.__name__]
    members = _public_members(upstream)
    for pattern in [d for d in documented if "*" in d]:  # serialize_* covers pydantic hooks
        documented |= {m for m in members if re.fullmatch(pattern.replace("*", r"\w+"), m)}
    fields = set(msgspec.structs.fields(ours) and (f.name for f in msgspec.structs.fields(ours)))
    missing = sorted(m for m in members if m not in documented and not hasattr(ours, m) and m not in fields)
    assert not missing, f"upstream {upstream.__name__} members neither on ours nor in docs/lifecycle.md: {missing}"
    shared = sorted(d for d in documented if "*" not in d and (hasattr(ours, d) or d in fields))
    assert not shared, f"documented as not applying, yet on ours: {shared}"
    stale = sorted(d for d in documented if "*" not in d and d not in members)
    assert not stale, f"documented as not applying, yet not upstream members: {stale}"


def _conversation() -> list[tuple[int | None, Any, bool]]:
    return [
        (None, ("system", "sys"), False),
        (0, ("user", "hi"), False),
        (1, ("assistant", "let me", [("c1", "add", '{"a": 1}')]), True),
        (2, ("tool", "2", "c1", "add"), False),
        (3, ("assistant", "4"), True),
        (1, ("assistant", "", [("c2", "mul", "{}")]), True),
    ]  # a second branch, not the last


def _ours() -> Trace:
    def message(spec: Any) -> Any:
        role, content, *rest = spec
        if role == "assistant":
            calls = [ToolCall(i, n, a) for i, n, a in rest[0]] if rest else None
            return AssistantMessage(content=content or None, tool_calls=calls)
        if role == "tool":
            return ToolMessage(tool_call_id=rest[0], content=content, name=rest[1])
        return {"system": SystemMessage, "user": UserMessage}[role](content)

    nodes = [MessageNode(p, message(m), sampled=s) for p, m, s in _conversation()]
    nodes[4].token_ids, nodes[4].logprobs = [1, 2], [-0.123456789, -1.0]
    return Trace(task=TraceTask(type="T"), nodes=nodes)


def _upstream() -> Any:
    t = upstream_types

    def message(spec: Any) -> Any:
        role, content, *rest = spec
        if role == "assistant":
            calls = [t.ToolCall(id=i, name=n, arguments=a) for i, n, a in rest[0]] if rest else None
            return t.AssistantMessage(content=content or None, tool_calls=calls)
        if role == "tool":
            return t.ToolMessage(tool_call_id=rest[0], content=content, name=rest[1])
        return {"system": t.SystemMessage, "user": t.UserMessage}[role](content=content)

    nodes = [upstream_graph.MessageNode(parent=p, message=message(m), sampled=s) for p, m, s in _conversation()]
    return upstream_trace.Trace(
        task=upstream_trace.TraceTask(type="T", data=UpstreamTaskData()),
        agent=upstream_trace.AgentInfo(config=AgentConfig()),
        nodes=nodes,
    )


def test_transcript_last_message_and_has_error_are_upstreams() -> None:
    ours, upstream = _ours(), _upstream()
    assert ours.transcript == upstream.transcript == "[system]\nsys\n\n[user]\nhi\n\n[assistant]\n[tool_call mul({})]"
    last = upstream.last_message
    assert (ours.last_message.role, ours.last_message.tool_calls[0].name) == (last.role, last.tool_calls[0].name)
    del ours.nodes[5], upstream.nodes[5]  # one branch: with a tool result and a text reply
    assert ours.transcript == upstream.transcript and "[tool add]\n2\n\n[assistant]\n4" in ours.transcript
    assert ours.last_message.content == upstream.last_message.content == "4"
    for ok in (True, False):
        ours.ok = upstream.ok = ok
        assert ours.has_error is upstream.has_error is (not ok)
    with pytest.raises(ValueError, match=r"^trace has no messages$"):
        _ = Trace(task=TraceTask(type="T")).last_message


def test_record_judge_call_records_as_upstream_and_keeps_usage_out_of_the_agents() -> None:
    request = {"messages": [{"role": "user", "content": "is 4 right?"}]}
    ours, upstream = _ours(), _upstream()
    for trace in (ours, upstream):
        trace.record_judge_call(
            name="judge",
            request=request,
            response=JudgeResponse(
                text="yes", parsed=True, usage=upstream_types.Usage(prompt_tokens=5, completion_tokens=1)
            ),
        )
    ours.record_judge_call(name="plain", request=request, response={"text": "no"})
    expected = upstream.info["judge_calls"][0]
    del expected["response"]["message"]["provider_state"]  # an upstream-only message field, None
    assert ours.info["judge_calls"][0] == expected
    assert ours.info["judge_calls"][1]["response"]["message"]["content"] == "no"
    assert ours.extra_usage == [Usage(prompt_tokens=5, completion_tokens=1)] and ours.usage == Usage()
    request["messages"].clear()
    assert ours.info["judge_calls"][0]["request"]["messages"]  # a copy, as upstream's


def test_to_record_is_json_with_rounded_token_floats_and_the_wire_stays_lossless() -> None:
    trace = _ours()
    record = trace.to_record()
    assert json.loads(json.dumps(record)) == record
    assert record["nodes"][4]["logprobs"] == [-0.1235, -1.0]
    assert trace.to_record(float_decimals=None)["nodes"][4]["logprobs"] == [-0.123456789, -1.0]
    assert decode_trace(encode_trace(trace)).nodes[4].logprobs == [-0.123456789, -1.0]
    assert record["verifiers"]["version"] == trace.verifiers.version
