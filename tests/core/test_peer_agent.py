"""Two policy agents in one rollout (a counting game on the simulated server over HTTP): each
on its own branch, with its own token sequences and its own reward."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

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
    # the rollout page: the agent's branch, each reply the agent's, each user turn player b's
    from rollout_ray._viewer.detail import trace_view

    shown = trace_view(trace)["messages"]
    assert [m["agent"] for m in shown if m["sampled"]] == ["agent"] * 3
    users = [(m["by_kind"], m["by"]) for m in shown if m["role"] == "user"]
    assert users == [("task", "task"), ("agent", "b"), ("agent", "b")]


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


class CountRewardingB(Task):
    """As ``Count``, but player B's reward is its own (``@reward(agent="b")``); ``b_wins``
    says whether B's right moves win (two samples of the group then differ for B only)."""

    b_wins = True

    def user_simulator(self) -> Any:
        return PeerAgent("You are player B. Answer with the number only.", name="b", ask=_move, tell=_move, max_turns=2)

    @reward
    def player_a(self, trace: Trace) -> float:
        return float(_said(trace, None) == ["13", "19", "25"])

    @reward(agent="b")
    def player_b(self, trace: Trace) -> float:
        return float((_said(trace, "b") == ["16", "22"]) == self.b_wins)


class CountRewardingBNot(CountRewardingB):
    b_wins = False


def test_each_agents_reward_and_sequences_are_columns_and_the_trainer_batch_is_per_agent() -> None:
    from rollout_ray._driver.batch import agent_batches
    from rollout_ray._driver.finalize import finalize
    from rollout_ray._record.agent_branches import agent_rewards
    from rollout_ray._record.arrow import RolloutRecord, records_to_table

    async def main() -> list[Trace]:
        async with SimulatedModelServer(SimulatedModelConfig(ttft=0, dialect="vllm")) as server:
            policy = OpenAIModel(server.base_url, name="simulated", token_capture="vllm")
            try:
                traces = []
                for cls in (CountRewardingB, CountRewardingBNot):
                    task = cls({"prompt": "We count up by 3 from 10. What is 10 + 3?"})
                    rollout = make_rollout(task, model=policy, harness=ChatHarness(), runtime_factory=MemoryRuntime)
                    traces.append(await asyncio.wait_for(rollout.run(), 60))
                return traces
            finally:
                await policy.aclose()

    traces = asyncio.run(main())
    assert [agent_rewards(t) for t in traces] == [{"agent": 1.0, "b": 1.0}, {"agent": 1.0, "b": 0.0}]
    table = records_to_table([RolloutRecord(t, "run", "g", i) for i, t in enumerate(traces)])
    rows = table.select(["token_branch", "token_agent", "agent_rewards"]).to_pylist()
    for row, trace in zip(rows, traces):
        owners = branch_agents(trace)
        assert sorted(row["token_agent"]) == ["agent", "b"]  # one sequence per agent's branch
        assert row["token_agent"] == [owners[b] for b in row["token_branch"]]
    assert [dict(r["agent_rewards"]) for r in rows] == [{"agent": 1.0, "b": 1.0}, {"agent": 1.0, "b": 0.0}]

    samples = finalize(table).samples
    batches = agent_batches(samples)
    assert sorted(batches) == ["agent", "b"]
    for agent, batch in batches.items():
        assert batch["agent"].tolist() == [agent, agent] and batch["sample_idx"].tolist() == [0, 1]
        mask = batch["loss_mask"] == 1.0
        advantages = [float(np.unique(batch["advantages"][r][mask[r]])[0]) for r in range(2)]
        # A's reward is the same in both samples: no advantage; B's differs: ±0.5 about its mean
        assert advantages == ([0.0, 0.0] if agent == "agent" else [0.5, -0.5])
        trained = {int(i) for r in range(2) for i in batch["input_ids"][r][mask[r]]}
        own = {i for t in traces for s in agent_sequences(t)[agent] for i, m in zip(s.input_ids, s.loss_mask) if m}
        assert trained == own  # each agent's batch trains only what that agent sampled
