"""The token record end to end: the simulated server (vLLM and SGLang shapes, with and without
template drift) → ``OpenAIModel``'s token capture → the session → sequences and a batch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rollout_ray import Request, RolloutSession, SystemMessage, Tool, ToolMessage, Trace, TraceTask, UserMessage
from rollout_ray._driver.finalize import FinalizeConfig, finalize
from rollout_ray._driver.group import Group
from rollout_ray._record.arrow import RolloutRecord, records_to_table
from rollout_ray._record.tokens import full_prompt, token_sequences
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer
from rollout_ray._simulated.tokenizer import IM_END

CALC = Tool("calc", "Evaluate arithmetic.", {"type": "object", "properties": {"expression": {"type": "string"}}})


async def served_rollout(dialect: str, drift: bool) -> Trace:
    """Three turns against the simulated server: a calculator call, its result reported, and
    an answer to "Go on."."""
    config = SimulatedModelConfig(ttft=0, dialect=dialect, template_drift=drift, policy_version=4)  # type: ignore[arg-type]
    async with SimulatedModelServer(config) as server:
        model = OpenAIModel(server.base_url, name="simulated", token_capture=dialect)  # type: ignore[arg-type]
        try:
            session = RolloutSession(Trace(task=TraceTask(type="T")), model)
            messages: list[Any] = [SystemMessage("Use the calculator."), UserMessage("What is 2 + 3?")]
            for _ in range(3):
                reply = (await asyncio.wait_for(session.chat(Request(list(messages), [CALC])), 30)).message
                messages.append(reply)
                for call in reply.tool_calls or ():
                    messages.append(ToolMessage(call.id, "5"))
                if not reply.tool_calls:
                    messages.append(UserMessage("Go on."))
            return session.trace
        finally:
            await model.aclose()


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_a_served_tool_rollout_is_one_sequence_of_the_servers_ids(dialect: str) -> None:
    trace = asyncio.run(served_rollout(dialect, drift=False))
    assert trace.num_turns == 3 and trace.nodes[trace.calls[0].node].message.tool_calls
    [sequence] = token_sequences(trace)
    last = trace.calls[-1]
    assert sequence.input_ids == full_prompt(trace, last) + trace.nodes[last.node].token_ids
    completions = [trace.nodes[c.node].token_ids for c in trace.calls]
    assert sum(sequence.loss_mask) == sum(len(c) for c in completions)
    assert all(c[-1] == IM_END for c in completions)
    assert trace.token_drift == [] and [c.policy for c in trace.calls] == [4, 4, 4]
    sampled = [lp for lp, m in zip(sequence.logprobs, sequence.loss_mask) if m]
    assert all(lp < 0 for lp in sampled)


def test_a_drifting_server_template_gives_a_sequence_per_drifted_turn_and_a_batch_of_them() -> None:
    trace = asyncio.run(served_rollout("vllm", drift=True))
    assert trace.token_drift == [1, 2]
    sequences = token_sequences(trace)
    assert [s.turns for s in sequences] == [(c.node,) for c in trace.calls]
    for sequence, call in zip(sequences, trace.calls):
        assert sequence.input_ids == full_prompt(trace, call) + trace.nodes[call.node].token_ids
    trace.ok = True  # as the rollout's close sets it
    table = records_to_table([RolloutRecord(trace, "run", "g", 0)])
    samples = finalize(table, FinalizeConfig()).samples
    batch = Group("g", samples, samples.slice(0, 0)).batch()
    assert batch["input_ids"].shape[0] == 3
    assert batch["loss_mask"].sum() == sum(len(trace.nodes[c.node].token_ids) for c in trace.calls)
