"""The operator, not the agent, decides what reaches the inference server (issue 21 §2): an
agent's request through the real proxy to a simulated model that records every body it gets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from rollout_ray import RolloutLimits, RolloutSession, Trace, TraceTask
from rollout_ray._core.sampling import FORWARDED_FIELDS
from rollout_ray._core.upstream_fields import FORCED_TOOL, NOT_FORWARDED
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer

pytestmark = pytest.mark.security

RED_TEAM = {
    "logits_processors": ["my_module.Bias"], "custom_logit_processor": "x", "guided_choice": ["yes"],
    "guided_json": {"type": "object"}, "guided_regex": "a+", "guided_grammar": "root ::= 'a'",
    "structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}, "logit_bias": {"42": 100},
    "min_tokens": 500, "ignore_eos": True, "chat_template": "{{ 'pwned' }}", "chat_template_kwargs": {"x": 1},
    "kv_transfer_params": {"do_remote_prefill": True}, "priority": -100, "request_id": "victim", "rid": "victim",
    "lora_path": "/etc/passwd", "prompt_logprobs": 20, "top_k": 1, "min_p": 0.9, "repetition_penalty": 3.0,
    "bad_words": ["no"], "allowed_token_ids": [1, 2], "stop_token_ids": [2], "skip_special_tokens": False,
    "truncate_prompt_tokens": 1, "add_generation_prompt": False, "return_hidden_states": True,
    "cache_salt": "s",
}  # fmt: skip
"""The 30 server-specific fields the red team sent (issue 21 §2)."""


class Recording(SimulatedModelServer):
    """The simulated model, keeping every generation request's body."""

    def __init__(self, config: SimulatedModelConfig) -> None:
        super().__init__(config)
        self.bodies: list[dict[str, Any]] = []

    def _app(self) -> web.Application:
        app = super()._app()

        @web.middleware
        async def record(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.path.endswith("/chat/completions"):
                self.bodies.append(msgspec.json.decode(await request.read()))
            return await handler(request)

        app.middlewares.append(record)
        return app


@asynccontextmanager
async def rig(
    operator: dict[str, Any], limits: RolloutLimits | None = None, forward: tuple[str, ...] = (), **config: Any
) -> AsyncIterator[tuple[Recording, Any, RolloutSession]]:
    async with Recording(SimulatedModelConfig(ttft=0, **config)) as server, HTTPInterception() as proxy:
        assert server.base_url is not None
        model = OpenAIModel(server.base_url, name="simulated", forward_fields=forward)
        session = RolloutSession(Trace(task=TraceTask(type="T")), model, sampling=operator, limits=limits)
        try:
            async with proxy.serve(session) as slot, aiohttp.ClientSession() as http:

                async def post(**fields: Any) -> dict[str, Any]:
                    body = {"model": "x", "messages": [{"role": "user", "content": "What is 2 + 3?"}], **fields}
                    async with http.post(
                        f"{slot.base_url}/v1/chat/completions",
                        json=body,
                        headers={"Authorization": f"Bearer {slot.model_secret}"},
                    ) as resp:
                        assert resp.status == 200, await resp.text()
                        answer: dict[str, Any] = await resp.json()
                        return answer

                yield server, post, session
        finally:
            await model.aclose()


def test_the_red_teams_thirty_fields_never_reach_the_server_and_each_is_on_the_trace() -> None:
    assert len(RED_TEAM) == 30

    async def main() -> tuple[list[dict[str, Any]], Trace]:
        async with rig({"temperature": 0.0}) as (server, post, session):
            await post(**RED_TEAM, temperature=2.0, seed=3, max_tokens=50)
            return server.bodies, session.trace

    [body], trace = asyncio.run(main())
    assert set(body) & set(RED_TEAM) == set()
    assert {k: body[k] for k in ("temperature", "seed", "max_tokens")} == {
        "temperature": 0.0,
        "seed": 3,
        "max_tokens": 50,
    }
    assert trace.calls[0].dropped == dict.fromkeys(RED_TEAM, NOT_FORWARDED)


def test_the_operators_length_overrides_every_alias_the_agent_sends() -> None:
    async def main() -> tuple[list[dict[str, Any]], Trace]:
        async with rig({"max_tokens": 16}, preamble_tokens=40) as (server, post, session):
            answer = await post(max_completion_tokens=1_000_000)
            assert answer["usage"]["completion_tokens"] == 16
            await post(max_tokens=1_000_000, max_completion_tokens=1_000_000)
            return server.bodies, session.trace

    bodies, trace = asyncio.run(main())
    assert [{k: b.get(k) for k in ("max_tokens", "max_completion_tokens")} for b in bodies] == [
        {"max_tokens": 16, "max_completion_tokens": None}
    ] * 2
    assert trace.calls[0].dropped == {"max_completion_tokens": "the operator's max_tokens overrides it"}
    assert trace.calls[1].dropped == {"max_completion_tokens": "the operator's max_tokens overrides it"}


def test_without_an_operator_setting_one_alias_goes_the_one_the_server_reads() -> None:
    async def main() -> list[dict[str, Any]]:
        async with rig({}) as (server, post, _):
            await post(max_tokens=5, max_completion_tokens=7)
            return server.bodies

    [body] = asyncio.run(main())
    assert (body.get("max_tokens"), body["max_completion_tokens"]) == (None, 7)


def test_a_token_budget_clamps_the_crossing_calls_length_to_what_is_left() -> None:
    async def main() -> tuple[list[dict[str, Any]], Trace]:
        limits = RolloutLimits(max_output_tokens=30)
        async with rig({}, limits, preamble_tokens=20) as (server, post, session):
            first = await post(max_tokens=1000)
            second = await post(max_completion_tokens=1000)
            assert first["usage"]["completion_tokens"] + second["usage"]["completion_tokens"] <= 30
            return server.bodies, session.trace

    bodies, trace = asyncio.run(main())
    used = trace.calls[0].usage.completion_tokens  # type: ignore[union-attr]
    assert bodies[0]["max_tokens"] == 30 and bodies[1]["max_completion_tokens"] == 30 - used
    assert trace.num_output_tokens <= 30


def test_a_forced_tool_choice_is_dropped_and_auto_goes() -> None:
    async def main() -> tuple[list[dict[str, Any]], Trace]:
        async with rig({}) as (server, post, session):
            await post(tool_choice="required")
            await post(tool_choice="auto", parallel_tool_calls=False, user="u1", logprobs=True, top_logprobs=2)
            return server.bodies, session.trace

    bodies, trace = asyncio.run(main())
    assert "tool_choice" not in bodies[0] and trace.calls[0].dropped == {"tool_choice": FORCED_TOOL}
    assert {k: bodies[1][k] for k in ("tool_choice", "parallel_tool_calls", "user", "top_logprobs")} == {
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "user": "u1",
        "top_logprobs": 2,
    }
    assert trace.calls[1].dropped is None


def test_the_operator_may_forward_more_fields() -> None:
    async def main() -> list[dict[str, Any]]:
        async with rig({}, forward=("top_k",)) as (server, post, _):
            await post(top_k=5, min_p=0.5)
            return server.bodies

    [body] = asyncio.run(main())
    assert body["top_k"] == 5 and "min_p" not in body


def test_the_forwarded_list_is_the_documented_one() -> None:
    import pathlib

    page = (pathlib.Path(__file__).parents[2] / "docs" / "tokens.md").read_text()
    listed = page.split("<!-- forwarded fields -->")[1].split("<!-- /forwarded fields -->")[0]
    assert {field.strip("` ") for field in listed.replace("\n", " ").split(",")} == FORWARDED_FIELDS
