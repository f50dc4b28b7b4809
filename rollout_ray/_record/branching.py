"""Why a rollout's conversation has more than one branch.

Every request carries the agent's whole context, and the graph (``graph.py``) reuses the
longest prefix it already holds, so a conversation that only grows stays one branch however
many turns it has: no re-rendering of the same prefix forks it. A request whose messages do
not extend any branch starts a new one, at the first message no branch has there. That is
what agents do when they rewrite their history, and the reason is read from the graph itself
(as verifiers v1 does, a branch is a physical exact-prefix view; its reason is a label beside
it, never a change of the branch):

- ``main``: the conversation the rollout began with (the first root, then at every fork the
  first child, in the order the nodes were committed).
- ``subagent``: its system prompt, or the tools of the call that started it, differ from the main
  branch's: another agent with its own context (Claude Code's Task, a Codex sub-agent),
  whether it ran nested or beside the main one.
- ``compaction``: a message the branch opens with carries a summary of earlier turns instead
  of them: it contains the text of a reply the model sampled before on another branch (the
  summary it was asked to write; a ``<summary>`` part of it suffices), or a compaction
  preamble an agent is known to send (``COMPACTION_MARKERS``).
- ``resample``: the branch adds no message of its own, only another sampled reply to a
  context the trace already holds (the agent asked again).
- ``edit``: anything else: the agent rewrote a message of its history.

The first match in this order wins. ``Trace.branch_reasons`` is aligned with
``Trace.branches`` and with ``TokenSequence.branch``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import msgspec

from .graph import Conversation, leaves, path_to
from .messages import SystemMessage, Tool, text_of

__all__ = ["BRANCH_REASONS", "COMPACTION_MARKERS", "branch_reasons", "tools_digest"]

BRANCH_REASONS = ("main", "subagent", "compaction", "resample", "edit")

COMPACTION_MARKERS = (
    "continued from a previous conversation",  # Claude Code's continuation after /compact
    "produced a summary of its thinking process",  # Codex's summary preamble
)
"""Lower-case phrases that open a compacted context in agents we know; the summary's own
text is the principled signal, these catch a summary the agent rewrote past recognition."""

MIN_SUMMARY_CHARS = 40
"""A sampled reply shorter than this is not taken for a summary ("OK" is in many messages)."""

_ENCODE = msgspec.json.Encoder().encode
_SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.DOTALL)


def tools_digest(tools: Sequence[Tool] | None) -> str | None:
    """A short digest of a request's tool definitions, in order (``None``: no tools): what
    tells one agent's calls from another's, and whether a prompt rendered the same tools as an
    earlier turn's (token in), without keeping the schemas on every call."""
    if not tools:
        return None
    return hashlib.blake2b(_ENCODE(tools), digest_size=8).hexdigest()


def branch_reasons(conversation: Conversation) -> list[str]:
    """One reason per branch (leaves in node order, as ``graph.branches``)."""
    nodes = conversation.nodes
    first_child: dict[int | None, int] = {}
    for i, node in enumerate(nodes):
        first_child.setdefault(node.parent, i)
    paths = [path_to(conversation, leaf) for leaf in leaves(conversation)]
    main = next((p for p in paths if _fork_at(conversation, p, first_child) is None), None)
    tools_at = {call.node: call.tools_digest for call in conversation.calls if call.node is not None}
    main_context = _context(conversation, main, 0, tools_at) if main is not None else None
    summaries: list[tuple[int, str]] | None = None  # (node, text) of the long sampled replies, once
    reasons = []
    for path in paths:
        k = _fork_at(conversation, path, first_child)
        if k is None:
            reasons.append("main")
        elif main_context is not None and _context(conversation, path, k, tools_at) != main_context:
            reasons.append("subagent")
        elif _summarizes(conversation, path, k, summaries := summaries or _summaries(conversation)):
            reasons.append("compaction")
        elif all(nodes[i].sampled for i in path[k:]):
            reasons.append("resample")
        else:
            reasons.append("edit")
    return reasons


def _fork_at(conversation: Conversation, path: list[int], first_child: dict[int | None, int]) -> int | None:
    """The first position of ``path`` that is not its parent's first child (``None``: the path
    is the main branch)."""
    nodes = conversation.nodes
    return next((k for k, i in enumerate(path) if first_child.get(nodes[i].parent) != i), None)


def _context(
    conversation: Conversation, path: list[int], start: int, tools_at: dict[int, str | None]
) -> tuple[str, str | None]:
    """What makes an agent: the system messages its branch opens with, and the tools of the
    first call at or after ``path[start]`` (the one that started the branch)."""
    nodes = conversation.nodes
    system = []
    for i in path:
        message = nodes[i].message
        if not isinstance(message, SystemMessage):
            break
        system.append(text_of(message.content))
    tools = next((tools_at[i] for i in path[start:] if i in tools_at), None)
    return "\n".join(system), tools


def _summaries(conversation: Conversation) -> list[tuple[int, str]]:
    """Each sampled reply that could be a summary: its node and its text (the ``<summary>``
    part, if it has one)."""
    out = []
    for i, node in enumerate(conversation.nodes):
        if node.sampled:
            reply = text_of(node.message.content).strip()
            found = _SUMMARY.search(reply)
            summary = found.group(1).strip() if found else reply
            if len(summary) >= MIN_SUMMARY_CHARS:
                out.append((i, summary))
    return out


def _summarizes(conversation: Conversation, path: list[int], k: int, summaries: list[tuple[int, str]]) -> bool:
    """Whether a message the branch opens with (from ``path[k]`` to its first sampled reply)
    carries a summary: the text of a reply sampled earlier on another branch, or a known
    compaction preamble."""
    nodes = conversation.nodes
    own = set(path)
    texts = []
    for i in path[k:]:  # the messages the branch opens with: its later turns summarize nothing
        if nodes[i].sampled:
            break
        texts.append(text_of(nodes[i].message.content))
    texts = [t for t in texts if t]
    if not texts:
        return False
    lowered = [t.lower() for t in texts]
    if any(marker in t for marker in COMPACTION_MARKERS for t in lowered):
        return True
    start = path[k]
    return any(
        any(summary in t for t in texts) for i, summary in summaries if i < start and i not in own
    )  # sampled before the branch, on another
