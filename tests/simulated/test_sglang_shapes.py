"""Token capture in SGLang's shapes (sgl-project/sglang protocol.py and serving_chat.py), and how
a request's fields pick the dialect."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sim_client import Client, ask, assemble, events, serve, user

from rollout_ray._simulated.model_server import SimulatedModelServer
from rollout_ray._simulated.template import render
from rollout_ray._simulated.tokenizer import IM_END, decode, token_text

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}
QUESTION = {
    "messages": user("What is 17 + 25?"),
    "return_token_ids": True,
    "return_meta_info": True,
    "logprobs": True,
    "top_logprobs": 3,
}


def check_entry(entry: dict[str, Any], k: int) -> None:
    """One ``logprobs.content`` entry as SGLang writes it: ``top_logprobs`` the true top-k."""
    assert set(entry) == {"token", "bytes", "logprob", "top_logprobs"}
    assert entry["bytes"] == list(entry["token"].encode()) and entry["logprob"] <= 0
    top = entry["top_logprobs"]
    assert len(top) == k and all(set(t) == {"token", "bytes", "logprob"} for t in top)
    assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
    assert top[0]["logprob"] >= entry["logprob"]


def test_json_has_ids_and_meta_info_per_choice_and_the_weight_version() -> None:
    status, data = ask(QUESTION, policy_version=7)
    assert status == 200
    assert set(data) == {"id", "object", "created", "model", "choices", "usage", "metadata"}
    assert data["metadata"] == {"weight_version": "7"}
    prompt = render(user("What is 17 + 25?"))
    assert data["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": 2,
        "total_tokens": len(prompt) + 2,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }
    (choice,) = data["choices"]
    assert set(choice) == {
        "index",
        "message",
        "logprobs",
        "finish_reason",
        "matched_stop",
        "prompt_token_ids",
        "token_ids",
        "meta_info",
    }
    assert choice["message"] == {"role": "assistant", "content": "42", "reasoning_content": None, "tool_calls": None}
    assert (choice["finish_reason"], choice["matched_stop"]) == ("stop", IM_END)
    assert choice["prompt_token_ids"] == prompt and decode(choice["token_ids"]) == "42<|im_end|>"
    content = choice["logprobs"]["content"]
    assert [e["token"] for e in content] == [token_text(i) for i in choice["token_ids"]]
    for entry in content:
        check_entry(entry, 3)
    meta = choice["meta_info"]
    tops = meta.pop("output_top_logprobs")
    assert meta == {
        "id": data["id"],
        "finish_reason": {"type": "stop", "matched": IM_END},
        "prompt_tokens": len(prompt),
        "completion_tokens": 2,
        "cached_tokens": 0,
        "weight_version": "7",
        "e2e_latency": 0.0,
        "output_token_logprobs": [[e["logprob"], i, e["token"]] for e, i in zip(content, choice["token_ids"])],
    }
    for top, entry in zip(tops, content, strict=True):
        assert [(lp, text) for lp, _, text in top] == [(t["logprob"], t["token"]) for t in entry["top_logprobs"]]
        assert all(token_text(i) == text for _, i, text in top)


def test_only_what_is_asked_for_is_there() -> None:
    _, data = ask({"messages": user("What is 17 + 25?"), "return_prompt_token_ids": True})
    (choice,) = data["choices"]
    assert "prompt_token_ids" in choice and "token_ids" not in choice and "meta_info" not in choice
    assert choice["logprobs"] is None
    _, data = ask({"messages": user("What is 17 + 25?"), "return_meta_info": True, "logprobs": True})
    meta = data["choices"][0]["meta_info"]
    assert "output_token_logprobs" in meta and "output_top_logprobs" not in meta
    assert data["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []


def test_a_tool_call_has_empty_content_and_indexed_calls() -> None:
    _, data = ask({**QUESTION, "tools": [ADD_TOOL]})
    (choice,) = data["choices"]
    assert choice["message"]["content"] == "" and choice["matched_stop"] is None
    assert choice["finish_reason"] == "tool_calls"
    assert choice["meta_info"]["finish_reason"] == {"type": "tool_calls", "matched": None}
    (call,) = choice["message"]["tool_calls"]
    assert call == {
        "id": "call_0",
        "index": 0,
        "type": "function",
        "function": {"name": "add", "arguments": '{"a": 17, "b": 25}'},
    }


def test_a_cut_answer_finishes_with_length() -> None:
    _, data = ask({"messages": user("Hello"), "return_meta_info": True, "max_tokens": 2})
    choice = data["choices"][0]
    assert choice["message"]["content"] == "I don't " and choice["finish_reason"] == "length"
    assert choice["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    assert choice["matched_stop"] is None


@pytest.mark.parametrize("field", ["return_token_ids", "return_prompt_token_ids", "return_meta_info"])
def test_ids_and_meta_info_are_refused_when_streaming(field: str) -> None:
    status, data = ask({"messages": user("hi"), "stream": True, field: True}, dialect="sglang")
    assert status == 400
    assert data == {
        "object": "error",
        "type": "BadRequest",
        "param": None,
        "code": 400,
        "message": f"{field} is not supported with streaming. Please set stream=false when using {field}=true.",
    }


def test_sse_carries_logprobs_per_token_and_finishes_in_its_own_chunk() -> None:
    async def body(server: SimulatedModelServer, post: Client) -> None:
        question = {"messages": user("Hello"), "logprobs": True, "top_logprobs": 2}
        _, raw = await post(question)
        whole = json.loads(raw)["choices"][0]
        _, raw = await post({**question, "stream": True, "stream_options": {"include_usage": True}})
        chunks = events(raw)
        role, *tokens, finish, usage, _ = chunks
        assert role["choices"] == [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
                "matched_stop": None,
            }
        ]
        for chunk in tokens:
            (choice,) = chunk["choices"]
            assert set(choice) == {"index", "delta", "logprobs", "finish_reason", "matched_stop"}
            assert set(choice["delta"]) == {"content"} and len(choice["logprobs"]["content"]) == 1
            check_entry(choice["logprobs"]["content"][0], 2)
        # The <|im_end|> token shows nothing: SGLang sends no chunk for it.
        streamed = [c["choices"][0]["logprobs"]["content"][0] for c in tokens]
        assert streamed == whole["logprobs"]["content"][:-1]
        assert finish["choices"] == [
            {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop", "matched_stop": IM_END}
        ]
        assert usage["choices"] == [] and usage["usage"]["reasoning_tokens"] == 0
        assert assemble(chunks)[:2] == ({"role": "assistant", "content": "I don't know."}, "stop")

    serve(body, dialect="sglang")


def test_sse_tool_calls_assemble_to_the_json_answer() -> None:
    async def body(server: SimulatedModelServer, post: Client) -> None:
        question = {"messages": user("What is 17 + 25?"), "tools": [ADD_TOOL], "logprobs": True}
        _, raw = await post(question)
        whole = json.loads(raw)["choices"][0]
        _, raw = await post({**question, "stream": True})
        chunks = events(raw)
        message, finish, _ = assemble(chunks)
        assert message["tool_calls"] == [
            {k: v for k, v in c.items() if k != "index"} for c in whole["message"]["tool_calls"]
        ]
        assert finish == "tool_calls"
        lps = [e for c in chunks[1:-2] for e in c["choices"][0]["logprobs"]["content"]]
        assert lps == whole["logprobs"]["content"]  # every token of a tool call has its chunk

    serve(body, dialect="sglang")


@pytest.mark.parametrize(
    ("dialect", "extra", "shape"),
    [
        ("vllm", {"return_meta_info": False}, "sglang"),
        ("vllm", {"return_prompt_token_ids": True}, "sglang"),
        ("sglang", {"return_tokens_as_token_ids": False}, "vllm"),
        ("sglang", {}, "sglang"),
        ("vllm", {}, "vllm"),
        ("vllm", {"return_meta_info": True, "return_tokens_as_token_ids": True}, "vllm"),
        ("sglang", {"return_meta_info": True, "return_tokens_as_token_ids": True}, "sglang"),
    ],
)
def test_the_request_fields_pick_the_dialect_and_the_config_breaks_ties(
    dialect: str, extra: dict[str, Any], shape: str
) -> None:
    _, data = ask({"messages": user("What is 17 + 25?"), "return_token_ids": True, **extra}, dialect=dialect)
    assert ("metadata" in data, "prompt_text" in data) == (shape == "sglang", shape == "vllm")
