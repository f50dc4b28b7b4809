"""Several policy agents in one trace: whose branch is whose, and each one's sequences.

The rollout's agent (``Trace.agent``) and each peer agent (``PeerAgent``: a player, a
proposer) talk through the same model boundary, each on its own branch of the conversation
graph. A peer's sampled replies are named by its ``UserTurn.agent_node``; every branch that
holds one is that peer's, every other branch the rollout agent's.

A reward names the agent it rewards (``@reward(agent=...)``; by default the rollout's own
agent), kept in ``Trace.info[REWARD_AGENTS]``; an agent's reward is the weighted sum of its
rewards (``agent_rewards``), stored per row in the Arrow table with each sequence's agent
(``token_agent``), and the trainer batch is split by agent on it (``Group.batch_by_agent``).
"""

from __future__ import annotations

from .graph import leaves, path_to
from .messages import Message
from .tokens import TokenSequence, token_sequences
from .trace import Trace

REWARD_AGENTS = "reward_agents"
"""The key of ``Trace.info`` mapping a reward's name to the agent it rewards, when that is not
the rollout's own agent."""


def set_reward_agent(trace: Trace, reward: str, agent: str) -> None:
    """Record that ``reward`` rewards ``agent``."""
    trace.info.setdefault(REWARD_AGENTS, {})[reward] = agent


def reward_agent(trace: Trace, reward: str) -> str:
    """The agent ``reward`` rewards: the one its ``@reward(agent=...)`` named, else the rollout's."""
    named = trace.info.get(REWARD_AGENTS)
    agent = named.get(reward) if isinstance(named, dict) else None
    return agent if isinstance(agent, str) else trace.agent.name


def agent_rewards(trace: Trace) -> dict[str, float]:
    """Each agent's reward: Σ score·weight over the scored rewards that reward it, for every
    agent of the trace (the rollout's, each peer with a branch, each named by a reward)."""
    totals = dict.fromkeys([trace.agent.name, *branch_owners(trace).values()], 0.0)
    for name, scored in trace.rewards.items():
        agent = reward_agent(trace, name)
        totals[agent] = totals.get(agent, 0.0) + (scored.score * scored.weight if scored is not None else 0.0)
    return totals


def sequence_agents(trace: Trace, sequences: list[TokenSequence]) -> list[str]:
    """The agent of each of ``sequences`` (the trace's own, ``token_sequences`` order)."""
    owners = branch_owners(trace)
    return [owners.get(s.turns[0], trace.agent.name) if s.turns else trace.agent.name for s in sequences]


def branch_owners(trace: Trace) -> dict[int, str]:
    """Each node of a peer's branches → the peer's name (the rollout agent's nodes are absent)."""
    owners: dict[int, str] = {}
    for turn in trace.user_turns:
        if turn.agent_node is not None and 0 <= turn.agent_node < len(trace.nodes):
            for node in path_to(trace, turn.agent_node):
                owners[node] = turn.by
    return owners


def branch_agents(trace: Trace) -> list[str]:
    """The agent of each branch, in ``Trace.branches`` order: what maps a trainer batch's
    ``branch`` column (``Group.batch``) to its agent."""
    owners = branch_owners(trace)
    return [owners.get(leaf, trace.agent.name) for leaf in leaves(trace)]


def agent_messages(trace: Trace, agent: str | None = None) -> list[Message]:
    """The messages of ``agent``'s latest branch (``None``: the rollout's own agent). Without
    peers this is ``Trace.messages``."""
    owners = branch_owners(trace)
    if not owners and agent is None:
        return trace.messages
    mine = [leaf for leaf in leaves(trace) if owners.get(leaf) == agent]
    return [trace.nodes[i].message for i in path_to(trace, mine[-1])] if mine else []


def agent_sequences(trace: Trace) -> dict[str, list[TokenSequence]]:
    """The trace's training sequences by agent: the rollout agent's under ``trace.agent.name``,
    each peer's under its name (the trainer batch per agent)."""
    sequences = token_sequences(trace)
    result: dict[str, list[TokenSequence]] = {}
    for sequence, owner in zip(sequences, sequence_agents(trace, sequences), strict=True):
        result.setdefault(owner, []).append(sequence)
    return result
