"""The conversation graph: which prefix of a request is already on the trace.

Every request carries the whole conversation. The longest prefix that matches existing nodes
(by parent and message identity) is reused; the rest is the new tail, committed as
non-sampled nodes followed by the sampled reply. A request that diverges from an earlier
branch forks a new branch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .messages import AssistantMessage, Message, message_hash
from .trace import MessageNode, Trace


class ConversationGraph:
    """An index over ``trace.nodes``; the session is its only writer."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._index: dict[tuple[int | None, bytes], int] = {}
        for i, node in enumerate(trace.nodes):
            self._index[(node.parent, message_hash(node.message))] = i

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
            parent = self.append(MessageNode(parent, message, sampled=False, timestamp=now))
        if reply is not None:
            parent = self.append(MessageNode(parent, reply, sampled=True, timestamp=now))
        return parent

    def append(self, node: MessageNode) -> int:
        """Append a node to the trace and index it (also copies nodes a live session committed elsewhere)."""
        self.trace.nodes.append(node)
        index = len(self.trace.nodes) - 1
        self._index[(node.parent, message_hash(node.message))] = index
        return index
