"""The token record: capture at the session, sequences per branch, loss masks, drift (issue 12 §2)."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from token_rig import REPLIES, SYSTEM, USER, TemplateModel, tool_rollout, wire

from rollout_ray import AssistantMessage, Request, Response, ToolMessage, Trace, TraceTask
from rollout_ray._core.hooks import Hook
from rollout_ray._record.tokens import TokenSequence, full_prompt, has_tokens, token_drift, token_sequences
from rollout_ray._record.trace import MessageNode, ModelCall, decode_trace, encode_trace
from rollout_ray._simulated.template import body
from rollout_ray._simulated.tokenizer import decode


def sampled_spans(sequence: TokenSequence) -> list[list[int]]:
    """The runs of ids with loss mask 1."""
    spans: list[list[int]] = []
    for k, (token, m) in enumerate(zip(sequence.input_ids, sequence.loss_mask)):
        if m:
            if not k or not sequence.loss_mask[k - 1]:
                spans.append([])
            spans[-1].append(token)
    return spans


def test_a_multi_turn_tool_rollout_is_one_sequence_with_its_completions_masked_in() -> None:
    model = TemplateModel(REPLIES)
    trace = tool_rollout(model)
    [sequence] = token_sequences(trace)
    last_call = trace.calls[-1]
    assert sequence.input_ids == model.prompts[-1] + trace.nodes[last_call.node].token_ids
    assert [decode(span) for span in sampled_spans(sequence)] == [body(wire(r)) + "<|im_end|>" for r in REPLIES]
    # Everything else is prompt: the system turn with the tools, the user and the tool turns.
    prompt_text = decode(t for t, m in zip(sequence.input_ids, sequence.loss_mask) if not m)
    assert "<tools>" in prompt_text and "What is 1 + 2 + 3?" in prompt_text and "tool\n6" in prompt_text
    assert sequence.turns == tuple(c.node for c in trace.calls)
    assert trace.token_drift == [] and [c.policy for c in trace.calls] == [7, 7, 7]


def test_logprobs_are_aligned_zero_on_prompt_ids() -> None:
    trace = tool_rollout(TemplateModel(REPLIES))
    [sequence] = token_sequences(trace)
    assert len(sequence.logprobs) == len(sequence.input_ids) == len(sequence.loss_mask)
    sampled = [lp for lp, m in zip(sequence.logprobs, sequence.loss_mask) if m]
    expected = [lp for c in trace.calls for lp in trace.nodes[c.node].logprobs]
    assert sampled == expected
    assert all(lp == 0.0 for lp, m in zip(sequence.logprobs, sequence.loss_mask) if not m)


def test_each_prompt_is_stored_once_as_the_ids_added_since_the_previous_turn() -> None:
    model = TemplateModel(REPLIES)
    trace = tool_rollout(model)
    first, second, third = trace.calls
    assert (first.prompt_shared, first.prompt_ids) == (0, model.prompts[0])
    previous = model.prompts[0] + trace.nodes[first.node].token_ids
    assert second.prompt_shared == len(previous)
    assert second.prompt_ids == model.prompts[1][len(previous) :]
    assert [full_prompt(trace, c) for c in trace.calls] == model.prompts
    stored = sum(len(c.prompt_ids) for c in trace.calls)
    assert stored < sum(len(p) for p in model.prompts) / 2


def test_template_drift_is_detected_and_starts_a_new_sequence_at_the_drifted_turn() -> None:
    model = TemplateModel(REPLIES, drift=True)
    trace = tool_rollout(model)
    assert trace.token_drift == [1, 2]  # turns 1 and 2 re-tokenized the turn before them
    sequences = token_sequences(trace)
    assert len(sequences) == 3
    for k, sequence in enumerate(sequences):
        completion = trace.nodes[trace.calls[k].node].token_ids
        # Each sequence is exactly what the server saw, then what it sampled.
        assert sequence.input_ids == model.prompts[k] + completion
        assert sequence.loss_mask == [0] * len(model.prompts[k]) + [1] * len(completion)
        assert sequence.turns == (trace.calls[k].node,)
    # The drift is real: the sampled ids of turn 0 are not in turn 1's prompt.
    previous = model.prompts[0] + trace.nodes[trace.calls[0].node].token_ids
    assert model.prompts[1][: len(previous)] != previous
    assert [full_prompt(trace, c) for c in trace.calls] == model.prompts


def test_the_token_record_survives_msgpack() -> None:
    trace = tool_rollout(TemplateModel(REPLIES, drift=True))
    again = decode_trace(encode_trace(trace))
    assert token_sequences(again) == token_sequences(trace)
    assert again.token_drift == [1, 2]


def test_a_rewritten_reply_keeps_no_ids_and_is_prompt_for_the_next_turn() -> None:
    def rewrite(response: Response) -> Response:
        if response.message.content == "Hmm.":
            return msgspec.structs.replace(response, message=AssistantMessage("Hmm!"))
        return response

    replies = [REPLIES[0], AssistantMessage("Hmm."), REPLIES[2]]
    trace = tool_rollout(TemplateModel(replies), response_interceptors=[Hook("rewrite", rewrite)])
    assert trace.nodes[trace.calls[1].node].token_ids is None and trace.calls[1].policy == 7
    [sequence] = token_sequences(trace)
    assert sequence.turns == (trace.calls[0].node, trace.calls[2].node)
    assert "assistant\nHmm!<|im_end|>" in decode(t for t, m in zip(sequence.input_ids, sequence.loss_mask) if not m)
    assert trace.token_drift == []


def test_a_model_without_token_capture_leaves_everything_none() -> None:
    class Plain(TemplateModel):
        async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Response:
            return Response(self.replies.pop(0))

    trace = tool_rollout(Plain(REPLIES))
    assert not has_tokens(trace)
    assert token_sequences(trace) == [] and trace.token_drift == []
    assert all(n.token_ids is None and n.logprobs is None for n in trace.nodes)
    assert all(c.prompt_ids is None and c.policy is None for c in trace.calls)


# -- hand-built traces ----------------------------------------------------------------------------


def hand_built() -> Trace:
    """system, user, a sampled turn, a tool result, a sampled turn; then a fork after the tool
    result with another sampled turn (a second branch)."""
    trace = Trace(task=TraceTask(type="T"))
    trace.nodes = [
        MessageNode(None, SYSTEM),
        MessageNode(0, USER),
        MessageNode(1, AssistantMessage("a"), sampled=True, token_ids=[10, 11], logprobs=[-0.5, -0.25]),
        MessageNode(2, ToolMessage("c", "3")),
        MessageNode(3, AssistantMessage("b"), sampled=True, token_ids=[20], logprobs=[-1.0]),
        MessageNode(3, AssistantMessage("c"), sampled=True, token_ids=[30, 31], logprobs=None, mask=[True, False]),
    ]
    trace.calls = [
        ModelCall(node=2, prompt_shared=0, prompt_ids=[1, 2, 3]),
        ModelCall(node=4, prompt_shared=5, prompt_ids=[4, 5]),
        ModelCall(node=5, prompt_shared=5, prompt_ids=[4, 6]),
    ]
    return trace


def test_hand_built_branches_give_one_sequence_each() -> None:
    first, second = token_sequences(hand_built())
    assert first == TokenSequence(
        branch=0,
        input_ids=[1, 2, 3, 10, 11, 4, 5, 20],
        loss_mask=[0, 0, 0, 1, 1, 0, 0, 1],
        logprobs=[0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.0],
        turns=(2, 4),
        policy=[None] * 8,  # no call recorded a version
    )
    assert (second.branch, second.input_ids, second.turns) == (1, [1, 2, 3, 10, 11, 4, 6, 30, 31], (2, 5))
    assert second.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 0]  # the node's mask drops its last id
    assert math.isnan(second.logprobs[-1]) and math.isnan(second.logprobs[-2])  # not returned


def test_hand_built_drift_before_a_fork_emits_the_shared_sequence_once() -> None:
    trace = hand_built()
    trace.calls[1].prompt_shared = trace.calls[2].prompt_shared = 4  # both re-tokenized id 11
    assert trace.token_drift == [1, 1]
    first, second, third = token_sequences(trace)
    assert (first.input_ids, first.turns, first.branch) == ([1, 2, 3, 10, 11], (2,), 0)
    assert (second.input_ids, second.loss_mask) == ([1, 2, 3, 10, 4, 5, 20], [0, 0, 0, 0, 0, 0, 1])
    assert (third.input_ids, third.turns, third.branch) == ([1, 2, 3, 10, 4, 6, 30, 31], (5,), 1)


def test_an_inconsistent_record_is_refused_with_the_node() -> None:
    trace = hand_built()
    trace.calls[1].prompt_shared = 9
    with pytest.raises(ValueError, match=r"node 4 shares 9 prompt ids, but its branch has 5 before it"):
        token_sequences(trace)
    trace = hand_built()
    trace.nodes[4].logprobs = [-1.0, -2.0]
    with pytest.raises(ValueError, match=r"node 4 has 2 logprobs for 1 ids"):
        token_sequences(trace)


def test_a_turn_without_prompt_ids_is_prompt_for_the_next() -> None:
    trace = hand_built()
    trace.calls[0].prompt_ids = None  # the server returned completion ids only
    for call, tail in zip(trace.calls[1:], (5, 6)):
        call.prompt_shared, call.prompt_ids = 0, [1, 2, 3, 10, 11, 4, tail]
    first, second = token_sequences(trace)
    assert first.turns == (4,) and first.loss_mask == [0] * 7 + [1]
    assert second.turns == (5,) and second.input_ids == [1, 2, 3, 10, 11, 4, 6, 30, 31]


def test_old_traces_decode_with_no_token_record() -> None:
    class OldCall(msgspec.Struct):
        node: int | None = None

    class OldNode(msgspec.Struct):
        parent: int | None
        message: Any
        sampled: bool = False

    class OldTrace(msgspec.Struct, kw_only=True):
        task: TraceTask
        nodes: list[OldNode]
        calls: list[OldCall]

    blob = msgspec.msgpack.encode(
        OldTrace(
            task=TraceTask(type="T"),
            nodes=[
                OldNode(None, {"role": "user", "content": "hi"}),
                OldNode(0, {"role": "assistant", "content": "yo"}, True),
            ],
            calls=[OldCall(1)],
        )
    )
    trace = decode_trace(blob)
    assert trace.calls[0].policy is None and trace.nodes[1].mask is None
    assert token_sequences(trace) == [] and token_drift(trace) == []
