"""Agents rewrite their history: through the real proxy and the simulated model, with the
official SDKs, a rollout that starts a sub-agent and compacts its conversation (as Claude Code
does) is recorded as a tree: one branch per context, each with its reason, one training
sequence per branch with its loss mask, and the row saying how many and why. A conversation
that only grows stays one branch and one sequence, whatever the dialect (no false fork)."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import pytest
from capture_rig import rig, run
from test_dialects import ANTHROPIC_TOOLS, DRIFTING, anthropic_client, openai_client

from rollout_ray import Trace
from rollout_ray._record.arrow import RolloutRecord, records_to_table
from rollout_ray._record.tokens import TokenSequence, full_prompt, token_sequences

MAIN_SYSTEM = "You are a coding agent. Be brief."
SUB_SYSTEM = "You are a search sub-agent: answer the parent agent's question and stop."
SUB_TOOLS: Any = [{"name": "grep", "description": "search files", "input_schema": {"type": "object"}}]
COMPACT = "Your task is to create a detailed summary of the conversation so far."
CONTINUED = (
    "This session is being continued from a previous conversation that ran out of context. "
    "The conversation is summarized below:\n{summary}\nWhat is 5*5?"
)
"""Claude Code's compaction: the whole conversation and a request for a summary, then a new
context of the same system prompt whose first user message carries the summary."""


def assert_sequence_trains_its_branch(trace: Trace, sequence: TokenSequence) -> None:
    """The sequence is its branch's last prompt and completion, and its loss mask is 1 on
    exactly the ids every turn of the branch sampled."""
    last = trace.nodes[sequence.turns[-1]]
    [call] = [c for c in trace.calls if c.node == sequence.turns[-1]]
    assert sequence.input_ids == full_prompt(trace, call) + last.token_ids  # type: ignore[operator]
    sampled = [t for i in sequence.turns for t in trace.nodes[i].token_ids or ()]
    assert [t for t, m in zip(sequence.input_ids, sequence.loss_mask) if m] == sampled
    branch_nodes = set(trace.branches[sequence.branch].nodes)
    assert set(sequence.turns) == {i for i in branch_nodes if trace.nodes[i].sampled}


async def create(client: anthropic.AsyncAnthropic, system: str, messages: list[Any], tools: Any) -> Any:
    return await client.messages.create(model="x", max_tokens=200, system=system, tools=tools, messages=messages)


def assistant(reply: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}


def test_a_sub_agent_and_a_compaction_each_start_a_branch_with_its_sequence_and_reason() -> None:
    async def main() -> Trace:
        async with rig(DRIFTING, token_capture="vllm") as r:
            session, slot = await r.open_session()
            async with anthropic_client(slot) as client:
                messages: list[Any] = [{"role": "user", "content": "Use the calculator: what is 17*3?"}]
                first = await create(client, MAIN_SYSTEM, messages, ANTHROPIC_TOOLS)
                assert first.stop_reason == "tool_use"

                # the tool starts two sub-agents at once (Claude Code's parallel Tasks): their
                # own system prompt and tools
                async def sub_agent(a: int) -> None:
                    sub: list[Any] = [{"role": "user", "content": f"What is {a}+3?"}]
                    found = await create(client, SUB_SYSTEM, sub, SUB_TOOLS)
                    sub += [assistant(found), {"role": "user", "content": f"And {a}+4?"}]
                    await create(client, SUB_SYSTEM, sub, SUB_TOOLS)

                await asyncio.gather(sub_agent(1), sub_agent(2))
                messages += [
                    assistant(first),
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": first.content[0].id, "content": "51"}],
                    },
                ]
                second = await create(client, MAIN_SYSTEM, messages, ANTHROPIC_TOOLS)
                messages += [assistant(second), {"role": "user", "content": COMPACT}]
                summary = await create(client, MAIN_SYSTEM, messages, ANTHROPIC_TOOLS)
                continued = [{"role": "user", "content": CONTINUED.format(summary=summary.content[0].text)}]
                after = await create(client, MAIN_SYSTEM, continued, ANTHROPIC_TOOLS)
                continued += [
                    assistant(after),
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": after.content[0].id, "content": "25"}],
                    },
                ]
                await create(client, MAIN_SYSTEM, continued, ANTHROPIC_TOOLS)
            return session.trace

    trace = run(main)
    assert trace.num_turns == 9
    # leaves in node order: the sub-agents ended first, then the main context (its last turn
    # wrote the summary), then the compacted context
    assert trace.branch_reasons == ["subagent", "subagent", "main", "compaction"]
    assert [len(b.calls) for b in trace.branches] == [2, 2, 3, 2]
    sequences = token_sequences(trace)
    assert [s.branch for s in sequences] == [0, 1, 2, 3] and trace.token_drift == []
    for sequence in sequences:
        assert_sequence_trains_its_branch(trace, sequence)
    compacted = trace.branches[3]
    assert trace.nodes[compacted.nodes[0]].message.content == MAIN_SYSTEM  # shared: not a sub-agent
    [row] = records_to_table([RolloutRecord(trace, "run", "g", 0)]).to_pylist()
    assert (row["branches"], row["branch_reasons"], row["token_branch"]) == (
        4,
        ["subagent", "subagent", "main", "compaction"],
        [0, 1, 2, 3],
    )


@pytest.mark.parametrize("dialect", ["messages", "responses"])
def test_eight_turns_of_one_conversation_stay_one_branch_and_one_sequence(dialect: str) -> None:
    """Each request re-sends the whole conversation, as Claude Code and Codex do, on a template
    that re-tokenizes replies: 8 turns are one branch and one sequence, not 8."""

    async def main() -> Trace:
        async with rig(DRIFTING, token_capture="vllm") as r:
            session, slot = await r.open_session()
            if dialect == "messages":
                async with anthropic_client(slot) as client:
                    messages: list[Any] = []
                    for k in range(8):
                        messages.append({"role": "user", "content": f"What is {k}+{k}?"})
                        messages.append(assistant(await create(client, MAIN_SYSTEM, messages, ANTHROPIC_TOOLS[:0])))
            else:
                async with openai_client(slot) as openai_sdk:
                    items: list[Any] = []
                    for k in range(8):
                        items.append({"role": "user", "content": f"What is {k}+{k}?"})
                        reply = await openai_sdk.responses.create(model="x", instructions=MAIN_SYSTEM, input=items)
                        items += [i.model_dump(exclude_none=True) for i in reply.output]
            return session.trace

    trace = run(main)
    assert trace.num_turns == 8 and trace.num_branches == 1 and trace.branch_reasons == ["main"]
    [sequence] = token_sequences(trace)
    assert len(sequence.turns) == 8
    assert_sequence_trains_its_branch(trace, sequence)
