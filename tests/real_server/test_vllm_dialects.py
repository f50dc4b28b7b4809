"""The Responses and Anthropic Messages dialects against a real vLLM (its CPU build, the tiny
model of ``scripts/vllm_cpu/``), token in and token out (issue 29 §2).

Two agent programs written against the official SDKs, run unchanged as ProgramHarness agents
(``programs/``): an ``openai`` tool loop on ``POST /v1/responses`` (it resends its whole input
each turn, as Codex does) and an ``anthropic`` one on ``POST /v1/messages`` (with ``role:
system`` messages inside ``messages``, as Claude Code sends them). The proxy translates each
to Chat Completions, and ``OpenAIModel(token_in=True)`` sends the prompt as ids through
vLLM's render and generate routes (``--enable-scale-out``).

The random model writes no tool call of its own, so each program forces one on its first two
turns (a grammar: ``tool_choice`` required / ``any``) and leaves the third to the model
(``auto``: plain text). What is checked, turn by turn, against the server itself:

* turn 1's prompt ids are the server's tokenization of the conversation (``/tokenize`` with
  its chat template and the tools);
* turn k+1's prompt ids are turn k's prompt and sampled ids, the template's end of an
  assistant turn, then exactly the server's tokenization of the new messages (its rendering of
  the conversation after its rendering of what came before). The whole rendering is not
  expected to equal the stored ids on later turns: this template re-renders a past tool call
  as ``\\n<tool_call>…`` where the model sampled ``<tool_call>…`` (the drift the Chat
  Completions text route records, ``test_vllm_cpu``); token in keeps what was sampled;
* the rollout is one training sequence holding every sampled id once, with its logprob;
* each sampled logprob is the model's teacher-forced one (``/v1/completions`` with
  ``prompt_logprobs``) within 1e-3, as ``test_vllm_cpu`` checks; under a grammar vLLM reports
  the masked distribution's, which is never below the model's own.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from vllm_server import NAME, Server, model_dir, post, serve, vllm_python

from rollout_ray import LocalRuntime, ModelCall, OpenAIModel, Request, Rollout, Task, Trace, reward
from rollout_ray._harnesses.program import ProgramHarness
from rollout_ray._record.graph import path_to
from rollout_ray._record.openai_codec import encode_request
from rollout_ray._record.tokens import full_prompt, token_sequences
from rollout_ray._serving.proxy import HTTPInterception

pytestmark = [pytest.mark.real_server, pytest.mark.timeout(900)]

PROGRAMS = Path(__file__).parent / "programs"
FORCED = [True, True, False]
"""Which of the programs' three turns sample under a tool grammar."""
TOLERANCE = 1e-3
"""Sampled and teacher-forced logprobs agree within it (``test_vllm_cpu``)."""
ENVIRONMENT = "Environment: working directory /work, platform linux."
REMINDER = "Reminder: answer with the sum."


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server with the token-in routes (``--enable-scale-out``) for the module."""
    python = vllm_python()
    tmp = tmp_path_factory.mktemp("vllm-dialects")
    with serve(python, model_dir(python, tmp), tmp, "--enable-scale-out") as server:
        yield server


class Sum(Task):
    @reward
    def finished(self, trace: Trace) -> float:
        """The program ran its three turns (the random model's answer is not judged)."""
        return float(len(trace.calls) == len(FORCED))


def run_program(server: Server, program: str, stream: bool) -> Trace:
    command = [sys.executable, "-W", "error", str(PROGRAMS / program), *(["stream"] if stream else [])]

    async def main() -> Trace:
        # The agent's forced tool_choice goes upstream only because the operator forwards it
        # (by default it is dropped: constrained decoding the policy did not choose).
        model = OpenAIModel(
            server.base_url, name=NAME, token_capture="vllm", token_in=True, forward_fields=["tool_choice"]
        )
        try:
            async with HTTPInterception() as proxy:
                rollout = Rollout(
                    Sum({"prompt": "What is 2 + 3? Use add."}),
                    ProgramHarness(command, timeout=600),
                    model=model,
                    interception=proxy,
                    runtime_factory=LocalRuntime,
                    sampling={"seed": 3, "temperature": 1.0},
                )
                return await asyncio.wait_for(rollout.run(), 600)
        finally:
            await model.aclose()

    return asyncio.run(main())


def conversation(trace: Trace, call: ModelCall) -> dict[str, Any]:
    """The Chat Completions body the proxy made of ``call`` (messages and tools), rebuilt
    from the trace: the path to the node the call sampled."""
    path = path_to(trace, call.node)[:-1]  # type: ignore[arg-type]
    request = Request([trace.nodes[i].message for i in path], trace.tools or None)
    return msgspec.json.decode(encode_request(request, {}, model=NAME, stream=False))


def rendered(server: Server, body: dict[str, Any], generation_prompt: bool) -> list[int]:
    """The server's own ids for ``body``'s messages and tools (its chat template)."""
    asked = {"model": NAME, "messages": body["messages"], "tools": body["tools"]}
    return post(server.root + "/tokenize", {**asked, "add_generation_prompt": generation_prompt})["tokens"]


def check_rollout(trace: Trace, server: Server, endpoint: str) -> list[list[int]]:
    """The checks of the module's docstring; returns each turn's new-message ids (turn 1: its
    whole prompt)."""
    assert trace.ok and trace.errors == [], trace.errors
    assert trace.rewards["finished"].score == 1.0, trace.calls
    assert [c.endpoint for c in trace.calls] == [endpoint] * len(FORCED)
    assert [t.name for t in trace.tools] == ["add"]
    nodes = [trace.nodes[c.node] for c in trace.calls]  # type: ignore[index]
    assert all(n.message.tool_calls for n, forced in zip(nodes, FORCED) if forced)
    prompts = [full_prompt(trace, c) for c in trace.calls]
    bodies = [conversation(trace, c) for c in trace.calls]
    glue = post(server.root + "/tokenize", {"model": NAME, "prompt": "<|im_end|>\n"})["tokens"]
    news: list[list[int]] = []
    for k, (call, node, prompt, body) in enumerate(zip(trace.calls, nodes, prompts, bodies)):
        assert call.error is None and prompt is not None and node.token_ids and node.logprobs, call
        assert len(node.logprobs) == len(node.token_ids) and all(math.isfinite(lp) for lp in node.logprobs)
        whole = rendered(server, body, generation_prompt=True)
        if k == 0:
            assert prompt == whole
            news.append(whole)
        else:
            before = nodes[k - 1].token_ids
            assert before is not None
            history = rendered(
                server, {**body, "messages": body["messages"][: len(bodies[k - 1]["messages"]) + 1]}, False
            )
            assert whole[: len(history)] == history  # the template does not rewrite earlier turns
            new = whole[len(history) :]
            held = max(j for j in range(len(glue) + 1) if before[len(before) - j :] == glue[:j])
            assert prompt == prompts[k - 1] + before + glue[held:] + new  # type: ignore[operator]
            news.append(new)
        scored = server.score(prompt, node.token_ids)
        if FORCED[k]:  # the masked distribution's logprob, never below the model's own
            assert all(lp >= raw - TOLERANCE for lp, raw in zip(node.logprobs, scored, strict=True))
        else:
            assert node.logprobs == pytest.approx(scored, abs=TOLERANCE)
    assert trace.token_drift == []
    (sequence,) = token_sequences(trace)
    sampled = [(i, lp) for i, m, lp in zip(sequence.input_ids, sequence.loss_mask, sequence.logprobs) if m]
    assert sampled == [(i, lp) for n in nodes for i, lp in zip(n.token_ids, n.logprobs)]  # type: ignore[arg-type]
    assert sequence.input_ids[: len(prompts[0])] == prompts[0]  # type: ignore[index, arg-type]
    print(
        f"\n{endpoint}: {len(nodes)} turns, one sequence of {len(sequence.input_ids)} ids ({len(sampled)} sampled), "
        f"prompt lengths {[len(p) for p in prompts]}",  # type: ignore[arg-type]
        file=sys.stderr,
    )
    return news


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_responses_agent_is_one_training_sequence_of_the_servers_ids(vllm: Server, stream: bool) -> None:
    trace = run_program(vllm, "responses_tools.py", stream)
    check_rollout(trace, vllm, "/responses")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_messages_agent_is_one_training_sequence_and_its_system_messages_render_in_place(
    vllm: Server, stream: bool
) -> None:
    """Claude Code's mid-conversation ``role: system`` messages go upstream as system messages
    where they were: the tiny model's ChatML template renders each as its own system turn (a
    template that refuses a system message after the first would fail here)."""
    trace = run_program(vllm, "messages_tools.py", stream)
    news = check_rollout(trace, vllm, "/messages")
    first = vllm.detokenize(news[0])
    assert first.endswith(
        f"<|im_start|>user\nWhat is 2 + 3? Use add.<|im_end|>\n<|im_start|>system\n{ENVIRONMENT}<|im_end|>\n"
        "<|im_start|>assistant\n"
    ), first
    (result,) = trace.tool_messages[:1]
    assert vllm.detokenize(news[1]) == (
        f"<|im_start|>tool\n{result.content}<|im_end|>\n<|im_start|>system\n{REMINDER}<|im_end|>\n<|im_start|>assistant\n"
    )
