"""The chat template: the prefix property across turns, its break in template-drift mode, and
reading a rendering back (``parse``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sim_client import Client, serve, user

from rollout_ray._simulated.model_server import SimulatedModelServer
from rollout_ray._simulated.template import Parsed, body, parse, render, text_of
from rollout_ray._simulated.tokenizer import IM_END, IM_START, SPECIAL_TOKENS, decode, encode

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


def test_the_template_renders_chatml_with_hermes_tool_calls() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 1 + 2?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "3"},
    ]
    text = decode(render(messages, [ADD_TOOL]))
    assert text == (
        "<|im_start|>system\nBe brief.\n\n# Tools\nYou may call one or more functions. Function signatures:\n"
        f"<tools>\n{json.dumps(ADD_TOOL)}\n</tools>\n"
        'Return each call as <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\n'
        "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n"
        '<|im_start|>assistant\n\n<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><|im_end|>\n'
        "<|im_start|>tool\n3<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert decode(render([{"role": "user", "content": "hi"}])) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


WORDS = st.text(alphabet=st.characters(codec="utf-8"), max_size=20)
CALL = st.builds(
    lambda name, args: {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}},
    st.text(alphabet="abcdefgh_", min_size=1, max_size=8),
    st.dictionaries(st.text(max_size=4), st.integers() | st.text(max_size=6), max_size=3),
)
ASSISTANT = st.builds(
    lambda text, calls: {"role": "assistant", "content": text, "tool_calls": calls},
    st.none() | WORDS,
    st.lists(CALL, max_size=2),
)
OTHER = st.builds(
    lambda role, text: {"role": role, "content": text}, st.sampled_from(["user", "tool", "system"]), WORDS
)


@settings(max_examples=60, deadline=None)
@given(
    turns=st.lists(st.tuples(st.lists(OTHER, min_size=1, max_size=2), ASSISTANT), min_size=3, max_size=5),
    tools=st.none() | st.just([ADD_TOOL]),
)
def test_each_prompt_begins_with_the_previous_prompt_and_its_completion(
    turns: list[tuple[list[dict[str, Any]], dict[str, Any]]], tools: Any
) -> None:
    messages: list[dict[str, Any]] = []
    for others, assistant in turns:
        messages += others
        prompt = render(messages, tools)
        completion = [*encode(body(assistant)), IM_END]  # what the model samples for this answer
        messages.append(assistant)
        later = render([*messages, {"role": "user", "content": "next"}], tools)
        assert later[: len(prompt) + len(completion)] == prompt + completion


def _conversation(post: Client, capture: dict[str, Any], tools: list[Any], drift: bool = False) -> Any:
    """Four turns with two tool calls; yields ``(prompt ids, completion ids, message)`` per turn."""

    async def run() -> list[tuple[list[int], list[int], dict[str, Any]]]:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "Use the tool."},
            {"role": "user", "content": "What is 17 + 25?"},
        ]
        turns = []
        for follow_up in (
            {"role": "tool", "tool_call_id": "call_0", "content": "42"},
            {"role": "user", "content": "And 3 + 4?"},
            {"role": "tool", "tool_call_id": "call_1", "content": "7"},
            None,
        ):
            status, raw = await post({"messages": messages, "tools": tools, "return_token_ids": True, **capture})
            assert status == 200
            data = json.loads(raw)
            (choice,) = data["choices"]
            prompt = data["prompt_token_ids"] if "prompt_token_ids" in data else choice["prompt_token_ids"]
            assert data["usage"]["prompt_tokens"] == len(prompt) == len(render(messages, tools, drift=drift))
            turns.append((prompt, choice["token_ids"], choice["message"]))
            messages += [choice["message"], *([follow_up] if follow_up else [])]
        return turns

    return run()


@pytest.mark.parametrize("capture", [{}, {"return_meta_info": True}], ids=["vllm", "sglang"])
def test_the_prefix_property_holds_across_turns_with_tool_calls(capture: dict[str, Any]) -> None:
    async def body_(server: SimulatedModelServer, post: Client) -> None:
        turns = await _conversation(post, capture, [ADD_TOOL])
        assert [t[2].get("tool_calls") is not None and t[2]["tool_calls"] != [] for t in turns] == [
            True,
            False,
            True,
            False,
        ]
        assert [t[2]["content"] for t in turns[1::2]] == ["42", "7"]
        for (prompt, completion, _), (later, _, _) in zip(turns, turns[1:]):
            assert later[: len(prompt) + len(completion)] == prompt + completion

    serve(body_)


def test_template_drift_breaks_the_prefix_exactly_where_the_assistant_turn_begins() -> None:
    async def body_(server: SimulatedModelServer, post: Client) -> None:
        turns = await _conversation(post, {}, [ADD_TOOL], drift=True)
        for (prompt, completion, _), (later, _, _) in zip(turns, turns[1:]):
            sampled = prompt + completion
            first = next(i for i, (a, b) in enumerate(zip(later, sampled)) if a != b)
            assert first == len(prompt) - 1  # the assistant header's last token: "t\n" ...
            assert prompt[-2:] != later[len(prompt) - 2 : len(prompt)]
            assert later[: len(prompt) - 1] == prompt[:-1]  # ... everything before it holds
            assert prompt[-(len(encode("assistant\n")) + 1)] == IM_START
            assert decode(later).startswith(decode(sampled))  # the text is the same, the ids are not

    serve(body_, template_drift=True)


def _canonical(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation as the template keeps it: roles, content, calls' names and arguments."""
    out = []
    for m in messages:
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or ()]
        out.append({"role": m["role"], "content": m.get("content") or None, "calls": calls})
    return out


@settings(max_examples=60, deadline=None)
@given(
    turns=st.lists(
        st.tuples(st.lists(OTHER.filter(lambda m: m["role"] != "system"), min_size=1, max_size=2), ASSISTANT),
        min_size=1,
        max_size=3,
    ),
    system=st.none() | WORDS,
    tools=st.none() | st.just([ADD_TOOL]),
    drift=st.booleans(),
    completion=st.lists(st.integers(16, 300), max_size=5),
)
def test_parse_reads_a_rendering_back_with_the_completion_after_it(
    turns: list[tuple[list[dict[str, Any]], dict[str, Any]]],
    system: str | None,
    tools: Any,
    drift: bool,
    completion: list[int],
) -> None:
    messages: list[dict[str, Any]] = [] if system is None else [{"role": "system", "content": system}]
    for others, assistant in turns:
        messages += [*others, assistant]
    messages.append({"role": "user", "content": "next"})
    texts = [text_of(m.get("content")) for m in messages] + [json.dumps(tools)]
    assume(not any(special in t for t in texts for special in SPECIAL_TOKENS))  # ambiguous in any ChatML
    assume(not any("<tool_call>" in t or "# Tools" in t for t in texts))
    parsed = parse(render(messages, tools, drift=drift) + completion)
    assert parsed.completion == completion and parsed.tools == tools
    assert _canonical(parsed.messages) == _canonical(messages)


def test_parse_of_ids_without_a_generation_prompt_is_all_conversation() -> None:
    ids = render(user("hi"))
    assert parse(ids) == parse(ids[:-4]) == Parsed(user("hi"), None, [])  # with and without one
    assert parse(ids[:3]) == parse([]) == Parsed([], None, [])  # a turn never closed reads as nothing
