"""Several policy agents in one trace: whose branch is whose, and each one's sequences.

The rollout's agent (``Trace.agent``) and each peer agent (``PeerAgent``: a player, a
proposer) talk through the same model boundary, each on its own branch of the conversation
graph. A peer's sampled replies are named by its ``UserTurn.agent_node``; every branch that
holds one is that peer's, every other branch the rollout agent's.
"""

from __future__ import annotations

from .graph import leaves, path_to
from .messages import Message
from .tokens import TokenSequence, token_sequences
from .trace import Trace


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
    owners = branch_owners(trace)
    result: dict[str, list[TokenSequence]] = {}
    for sequence in token_sequences(trace):
        owner = owners.get(sequence.turns[0], trace.agent.name) if sequence.turns else trace.agent.name
        result.setdefault(owner, []).append(sequence)
    return result
