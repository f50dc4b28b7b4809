"""Why a conversation branches (``branching.py``): each reason from the graph alone, the
first match winning, and the row's ``branches`` / ``branch_reasons`` columns, null in a shard
written before them."""

from __future__ import annotations

from pathlib import Path

from rollout_ray import Trace, TraceTask
from rollout_ray._record.arrow import RolloutRecord, records_to_table
from rollout_ray._record.branching import tools_digest
from rollout_ray._record.graph import ConversationGraph
from rollout_ray._record.messages import AssistantMessage, Message, SystemMessage, Tool, UserMessage
from rollout_ray._record.store import ShardWriter, read_run
from rollout_ray._record.trace_parts import ModelCall

SYSTEM = SystemMessage(content="You are the main agent.")
HI = UserMessage(content="hi")
HELLO = AssistantMessage(content="hello")
SUMMARY = "The user greeted the assistant twice and asked for nothing else yet."


def commit(
    trace: Trace, graph: ConversationGraph, messages: list[Message], reply: str, tools: list[Tool] | None = None
) -> None:
    node = graph.commit(messages, AssistantMessage(content=reply))
    trace.calls.append(ModelCall(node=node, tools_digest=tools_digest(tools)))


def test_each_reason_is_read_from_the_graph() -> None:
    trace = Trace(task=TraceTask(type="T"))
    graph = ConversationGraph(trace)
    commit(trace, graph, [SYSTEM, HI], "hello")
    # the summary the model wrote (tags and all), then a context that carries it, not the turns
    commit(
        trace,
        graph,
        [SYSTEM, HI, HELLO, UserMessage(content="Summarize.")],
        f"<analysis>they said hi</analysis><summary>{SUMMARY}</summary>",
    )
    commit(trace, graph, [SYSTEM, UserMessage(content=f"Earlier:\n{SUMMARY}\nGo on.")], "ok")
    commit(trace, graph, [SystemMessage(content="You are a sub-agent."), UserMessage(content="find x")], "x")
    commit(trace, graph, [SYSTEM, UserMessage(content="hello there")], "hi")  # the first message rewritten
    commit(trace, graph, [SYSTEM, HI], "hello again")  # the same context asked again
    commit(
        trace, graph, [SYSTEM, HI, HELLO, UserMessage(content="grep")], "found", tools=[Tool(name="grep")]
    )  # the main's system prompt, tools of its own
    assert trace.branch_reasons == ["main", "compaction", "subagent", "edit", "resample", "subagent"]
    [row] = records_to_table([RolloutRecord(trace, "run", "g", 0)]).to_pylist()
    assert row["branches"] == 6 and row["branch_reasons"] == trace.branch_reasons


def test_a_short_reply_repeated_later_is_no_summary() -> None:
    trace = Trace(task=TraceTask(type="T"))
    graph = ConversationGraph(trace)
    commit(trace, graph, [SYSTEM, HI], "ok")
    commit(trace, graph, [SYSTEM, UserMessage(content="ok, then do it")], "done")
    assert trace.branch_reasons == ["main", "edit"]


def test_one_conversation_and_no_conversation() -> None:
    trace = Trace(task=TraceTask(type="T"))
    assert trace.branch_reasons == []
    graph = ConversationGraph(trace)
    commit(trace, graph, [SYSTEM, HI], "hello")
    commit(trace, graph, [SYSTEM, HI, HELLO, UserMessage(content="and?")], "and nothing")
    assert trace.branch_reasons == ["main"]


def test_a_shard_written_before_the_branch_columns_reads_with_nulls_there(tmp_path: Path) -> None:
    trace = Trace(task=TraceTask(type="T"))
    commit(trace, ConversationGraph(trace), [SYSTEM, HI], "hello")
    table = records_to_table([RolloutRecord(trace, "run", "old", 0)]).drop_columns(["branches", "branch_reasons"])
    writer = ShardWriter(tmp_path, rows_per_shard=1)
    writer.write(table.replace_schema_metadata({b"rollout_ray.schema_version": b"4"}))
    writer.write(records_to_table([RolloutRecord(trace, "run", "new", 0)]))
    writer.close()
    read = read_run(tmp_path)
    assert read.column("branches").to_pylist() == [None, 1]
    assert read.column("branch_reasons").to_pylist() == [None, ["main"]]
