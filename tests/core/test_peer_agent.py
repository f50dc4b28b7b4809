"""Two policy agents in one rollout (a counting game on the simulated server over HTTP): each
on its own branch, with its own token sequences and its own reward."""

from __future__ import annotations

import asyncio
from typing import Any

from rollout_ray import (
    AssistantMessage,
    ChatHarness,
    PeerAgent,
    Task,
    Trace,
    agent_messages,
    agent_sequences,
    reward,
)
from rollout_ray._record.agent_branches import branch_agents
from rollout_ray._record.messages import text_of
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer
from rollout_ray.testing import MemoryRuntime

from conftest import make_rollout


def _move(reply: str) -> str:
    return f"Your opponent said {reply}. What is {reply} + 3?"


def _said(trace: Trace, agent: str | None) -> list[str]:
    return [text_of(m.content) for m in agent_messages(trace, agent) if isinstance(m, AssistantMessage)]


class Count(Task):
    """Players take turns adding 3; each is rewarded for its own moves."""

    def user_simulator(self) -> Any:
        return PeerAgent("You are player B. Answer with the number only.", name="b", ask=_move, tell=_move, max_turns=2)

    @reward
    def player_a(self, trace: Trace) -> float:
        return float(_said(trace, None) == ["13", "19", "25"])

    @reward
    def player_b(self, trace: Trace) -> float:
        return float(_said(trace, "b") == ["16", "22"])


def test_two_players_each_on_its_own_branch_with_its_own_sequences_and_reward() -> None:
    async def main() -> Trace:
        async with SimulatedModelServer(SimulatedModelConfig(ttft=0, dialect="vllm")) as server:
            policy = OpenAIModel(server.base_url, name="simulated", token_capture="vllm")
            try:
                task = Count({"prompt": "We count up by 3 from 10. What is 10 + 3?"})
                rollout = make_rollout(task, model=policy, harness=ChatHarness(), runtime_factory=MemoryRuntime)
                return await asyncio.wait_for(rollout.run(), 60)
            finally:
                await policy.aclose()

    trace = asyncio.run(main())
    assert trace.ok and trace.num_turns == len(trace.calls) == 5 and trace.num_branches == 2
    assert trace.rewards["player_a"].score == trace.rewards["player_b"].score == 1.0  # type: ignore[union-attr]
    assert [t.content for t in trace.user_turns] == [_move("16"), _move("22")]
    by_agent = agent_sequences(trace)
    assert sorted(by_agent) == ["agent", "b"] and all(len(s) == 1 for s in by_agent.values())
    for sequences in by_agent.values():  # each batch trains exactly its own agent's sampled ids
        [sequence] = sequences
        assert sum(sequence.loss_mask) == sum(len(trace.nodes[n].token_ids or ()) for n in sequence.turns)
    owners = branch_agents(trace)  # a batch row's branch → its agent
    assert sorted(owners) == ["agent", "b"] and all(owners[s.branch] == a for a, ss in by_agent.items() for s in ss)
    a_nodes, b_nodes = set(by_agent["agent"][0].turns), set(by_agent["b"][0].turns)
    assert len(a_nodes) == 3 and len(b_nodes) == 2 and b_nodes == {t.agent_node for t in trace.user_turns}


def test_a_peer_agent_needs_an_in_process_harness() -> None:
    from rollout_ray import UserSimulatorError
    from rollout_ray.testing import ScriptedHarness, ScriptedModel

    from conftest import run

    rollout = make_rollout(
        Count({"prompt": "What is 1 + 3?"}),
        model=ScriptedModel(default="4"),
        harness=ScriptedHarness(in_process=False),
        interception=None,
    )
    trace = run(rollout.run())
    assert trace.last_error is not None and trace.last_error.is_a(UserSimulatorError)
    assert "needs the rollout's session in process" in trace.last_error.message
