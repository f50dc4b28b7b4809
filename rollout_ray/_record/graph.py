"""The conversation graph: its walk (leaves, root-to-leaf paths, branches) and the index that
tells which prefix of a request is already on the trace.

Each ``MessageNode`` names its ``parent``; a branch is a root-to-leaf path, with the model
calls that committed a node on it. Every request carries the whole conversation. The
longest prefix that matches existing nodes (by parent and message identity) is reused; the
rest is the new tail, committed as non-sampled nodes followed by the sampled reply. A
request that diverges from an earlier branch forks a new branch.

A message is recorded with its texts cut at ``max_message_chars`` (``capped.py``), and
indexed by its identity as it arrived, so the next request, which carries it whole, matches.

The walk reads any ``Conversation`` (a ``Trace`` is one), so the token record and the trace
both call it without importing each other.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .capped import MAX_MESSAGE_CHARS, cap_message, text_chars
from .messages import AssistantMessage, Message, message_hash
from .trace_parts import MessageNode, ModelCall


class Conversation(Protocol):
    """What the walk reads of a trace: its id (for messages), its nodes, and the model calls
    that committed them."""

    id: str
    nodes: list[MessageNode]
    calls: list[ModelCall]


@dataclass(frozen=True)
class Branch:
    """A root-to-leaf path: its node indices and the calls that committed a node on it."""

    nodes: tuple[int, ...]
    calls: tuple[ModelCall, ...]


def leaves(conversation: Conversation) -> list[int]:
    """The nodes no node names as parent, in node order."""
    nodes = conversation.nodes
    has_child = [False] * len(nodes)
    for node in nodes:
        if node.parent is not None and 0 <= node.parent < len(nodes):
            has_child[node.parent] = True
    return [i for i, parent in enumerate(has_child) if not parent]


def path_to(conversation: Conversation, node: int) -> list[int]:
    """The node indices from the root down to ``node``."""
    nodes = conversation.nodes
    path: list[int] = []
    at: int | None = node
    while at is not None and len(path) <= len(nodes):  # a bad parent link cannot loop
        path.append(at)
        at = nodes[at].parent
    path.reverse()
    return path


def branches(conversation: Conversation) -> list[Branch]:
    """One branch per leaf, leaves in node order."""
    calls_at: dict[int, list[ModelCall]] = {}
    for call in conversation.calls:
        if call.node is not None:
            calls_at.setdefault(call.node, []).append(call)
    result = []
    for leaf in leaves(conversation):
        path = path_to(conversation, leaf)
        calls = tuple(c for i in path for c in calls_at.get(i, ()))
        result.append(Branch(tuple(path), calls))
    return result


class ConversationGraph:
    """An index over ``trace.nodes``; the session is its only writer.

    Args:
        trace: the conversation it indexes and appends to.
        max_message_chars: characters a committed message keeps of each of its texts.
    """

    def __init__(self, trace: Conversation, *, max_message_chars: int = MAX_MESSAGE_CHARS) -> None:
        self.trace = trace
        self.max_message_chars = max_message_chars
        self._index: dict[tuple[int | None, bytes], int] = {}
        for i, node in enumerate(trace.nodes):
            self._index[(node.parent, _identity(node))] = i

    def resolve(self, messages: Sequence[Message]) -> tuple[int | None, int]:
        """``(last matched node, number of matched messages)`` for the longest known prefix."""
        parent: int | None = None
        for count, message in enumerate(messages):
            found = self._index.get((parent, message_hash(message)))
            if found is None:
                return parent, count
            parent = found
        return parent, len(messages)

    def commit(self, messages: Sequence[Message], reply: AssistantMessage | None) -> int | None:
        """Append the unmatched tail of ``messages`` and then ``reply`` (sampled).

        Returns the reply's node index, or the last tail node's when ``reply`` is None.
        """
        parent, matched = self.resolve(messages)
        now = time.time()
        for message in messages[matched:]:
            parent = self.append(self._node(parent, message, sampled=False, timestamp=now))
        if reply is not None:
            parent = self.append(self._node(parent, reply, sampled=True, timestamp=now))
        return parent

    def _node(self, parent: int | None, message: Message, *, sampled: bool, timestamp: float) -> MessageNode:
        kept = cap_message(message, self.max_message_chars)
        if kept is message:
            return MessageNode(parent, message, sampled=sampled, timestamp=timestamp)
        return MessageNode(
            parent,
            kept,
            sampled=sampled,
            timestamp=timestamp,
            original_chars=text_chars(message),
            original_digest=message_hash(message),
        )

    def append(self, node: MessageNode) -> int:
        """Append a node to the trace and index it (also copies nodes a live session committed elsewhere)."""
        self.trace.nodes.append(node)
        index = len(self.trace.nodes) - 1
        self._index[(node.parent, _identity(node))] = index
        return index


def _identity(node: MessageNode) -> bytes:
    """What a request's message must hash to to be ``node``: the message as it arrived."""
    return node.original_digest or message_hash(node.message)
