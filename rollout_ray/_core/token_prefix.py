"""Token-in: the ids a request's branch already has, for a model that builds prompts from ids.

A token-in model client (``_serving/token_in.py`` over HTTP) sends the server the ids of the
conversation so far instead of its messages, so a turn's prompt is exactly the ids the policy
was trained on. The session tells the model, with each request, the ids the branch already
has (``tokens.branch_prefix``) and how many of the request's messages they hold; the client
renders only the rest. The ids are given only when the turn they end with was sampled with
the same tools (the prompt lists the tools): each call records the digest of its tools, and
the digest of an agent's tool set is remembered, as digesting it at every turn is costly.

Kept apart from ``session.py``: the session decides *when* a model is called; this decides
*what ids* it is told, from the trace and the conversation graph alone.
"""

from __future__ import annotations

from .._record.branching import tools_digest
from .._record.graph import ConversationGraph, path_to
from .._record.messages import Request, Tool
from .._record.tokens import branch_prefix
from .._record.trace import Trace


class TokenPrefix:
    """The known ids of a rollout's branches and the digests of its tool sets.

    Args:
        trace: the rollout's live trace (its calls and token record).
        graph: the trace's conversation graph, which places a request on its branch.
    """

    def __init__(self, trace: Trace, graph: ConversationGraph) -> None:
        self.trace = trace
        self.graph = graph
        self._digests: list[tuple[list[Tool], str | None]] = []  # the last tool sets seen, newest first

    def prefix(self, request: Request, tools: str | None) -> tuple[list[int] | None, int]:
        """The ids the request's branch already has, and how many of its messages they hold;
        none when the tools differ from those of the turn the ids end with (the prompt lists
        them; a sub-agent's calls in between, with tools of their own, change nothing here)."""
        parent, _ = self.graph.resolve(request.messages)
        if parent is None:
            return None, 0
        ids, held = branch_prefix(self.trace, path := path_to(self.trace, parent))
        if ids is None:
            return None, 0
        turn = path[held - 1]
        call = next((c for c in reversed(self.trace.calls) if c.node == turn), None)
        if call is None or call.tools_digest != tools:
            return None, 0
        return ids, held

    def digest(self, tools: list[Tool] | None) -> str | None:
        """``tools_digest(tools)``, remembered for the last few tool sets: an agent sends the
        same tools at every turn, and digesting Claude Code's (~76 KB of JSON) costs ~0.27 ms
        where comparing them costs ~1 us; a few, as a sub-agent's calls interleave."""
        if not tools:
            return None
        for k, (seen, digest) in enumerate(self._digests):
            if seen == tools:
                if k:
                    self._digests.insert(0, self._digests.pop(k))
                return digest
        digest = tools_digest(tools)
        self._digests = [(list(tools), digest), *self._digests[:3]]
        return digest
