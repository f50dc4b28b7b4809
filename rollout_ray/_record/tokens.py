"""The token record: what the policy sampled, turn by turn, and the sequences a trainer reads.

**Recording** (``record_tokens``, called by the session as a turn commits). A sampled node
keeps its completion ids and their log-probabilities (``MessageNode.token_ids`` /
``logprobs``); the call that sampled it keeps the policy version and its prompt ids
(``ModelCall.policy`` / ``prompt_shared`` / ``prompt_ids``). A prompt is stored as a
difference: its first ``prompt_shared`` ids are the *previous sequence* — the prompt and
completion of the nearest earlier turn on the same branch that has ids — and the rest are
``prompt_ids``. Without drift the whole previous sequence is shared, so a call stores only
what came since (the tool result, the next user turn, the generation prompt) and a trace
holds each id once, not the quadratic sum of its prompts. ``full_prompt`` rebuilds a prompt.

**Sequences** (``token_sequences``). Along a branch, turn k+1's prompt should begin with
turn k's prompt + completion (the prefix property); then the sequence grows by the new
prompt ids (loss mask 0) and the completion (loss mask 1, or the node's ``mask``). Where it
does not — the server's chat template re-tokenized an earlier turn, *drift* — the policy is
to **start a new sequence**: the current one ends as it stands, and the next begins with
turn k+1's prompt exactly as the server saw it (all loss mask 0, earlier completions
included) and goes on from there. So every sequence is exactly what the server conditioned
on, and every sampled id is trained once per branch, with the logprob it was sampled with.
Splicing (keeping turn k's sampled ids and appending the new prompt's tail) was rejected:
where the re-rendered turn ends in the new prompt cannot be told without the tokenizer,
and turn k+1 was sampled on the re-rendered context, not on the spliced one. The price of
a new sequence is its prompt, recomputed once more by the trainer. ``token_drift`` (and
``Trace.token_drift``) lists the drifted turns.

**Versions.** Each completion id records the policy version that sampled it
(``completion_versions``: ``ModelCall.token_policy``, run-length, or the call's ``policy``): a
call interrupted by a weight update and continued holds ids of two versions. A sequence's
``policy`` is aligned to its ``input_ids``, ``None`` on prompt ids; ``policy_range`` is the
oldest and newest version a rollout's calls sampled with.

``logprobs`` is aligned to ``input_ids``: 0.0 on prompt ids (system, user and tool ids, the
template's, and earlier completions that a new sequence repeats as prompt), NaN at a sampled
id whose logprob the server did not return. A sequence
that ends before branches fork (by drift) is emitted once, for the first of them.

A trace without ids costs a ``None`` check per call here: ``has_tokens`` is False.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .graph import Conversation, leaves, path_to
from .trace_parts import MessageNode, ModelCall

__all__ = [
    "Lengths", "TokenSequence", "branch_prefix", "completion_versions", "full_prompt", "has_tokens", "policy_range", "record_tokens",
    "sequence_turns", "token_drift", "token_sequences",
]  # fmt: skip


@dataclass(frozen=True)
class TokenSequence:
    """One training sequence of a trace: ids, loss mask and sampling logprobs, aligned."""

    branch: int
    """The index in ``Trace.branches`` of the (first) branch it belongs to."""
    input_ids: list[int]
    loss_mask: list[int]
    """1 on ids the policy sampled (unless the node's ``mask`` says not), else 0."""
    logprobs: list[float]
    """The sampling logprob of each completion id (NaN: not returned); 0.0 on prompt ids."""
    turns: tuple[int, ...]
    """The sampled nodes whose completions it trains, in order."""
    policy: list[int | None] = field(default_factory=list)
    """The policy version that sampled each id where the loss mask says sampled, ``None`` on
    prompt ids (and where no version is known)."""


def record_tokens(trace: Conversation, call: ModelCall, response: Any, *, rewritten: bool = False) -> None:
    """Record what ``response`` captured on ``call`` and on the node it committed.

    Reads the ``Response`` fields ``policy_version``, ``token_ids``, ``token_logprobs`` and
    ``prompt_token_ids`` (absent or ``None``: not captured). Call it after the commit and
    before ``call`` is appended to ``trace.calls``. A reply an interceptor ``rewritten`` keeps
    no ids: its message is not what they say (the next prompt holds it, as prompt ids).
    """
    policy = getattr(response, "policy_version", None)
    if policy is not None:
        call.policy = policy
    completion = getattr(response, "token_ids", None)
    if completion is None or call.node is None or rewritten:
        return
    versions = getattr(response, "token_versions", None)
    if versions and len(versions) == len(completion):
        if versions[0] is not None:
            call.policy = versions[0]
        runs = _runs(versions)
        call.token_policy = None if len(runs) == 1 and runs[0][0] == call.policy else runs
    node = trace.nodes[call.node]
    node.token_ids = completion
    node.logprobs = getattr(response, "token_logprobs", None)
    prompt = getattr(response, "prompt_token_ids", None)
    if prompt is None:
        return
    previous = _previous_sequence(trace, call.node, _turn_calls(trace))
    shared = _common_prefix(previous, prompt)
    call.prompt_shared, call.prompt_ids = shared, prompt[shared:]


def completion_versions(call: ModelCall, size: int) -> list[int | None]:
    """The policy version of each of the ``size`` completion ids of ``call``."""
    if call.token_policy is None:
        return [call.policy] * size
    versions = [v for v, count in call.token_policy for _ in range(count)]
    return versions if len(versions) == size else [call.policy] * size


def policy_range(trace: Conversation) -> tuple[int | None, int | None]:
    """The oldest and the newest policy version the trace's model calls sampled with
    (``(None, None)``: none recorded one)."""
    seen = [
        v
        for call in trace.calls
        for v in ((r[0] for r in call.token_policy) if call.token_policy else (call.policy,))
        if v is not None
    ]
    return (min(seen), max(seen)) if seen else (None, None)


def _runs(versions: list[int | None]) -> list[tuple[int | None, int]]:
    runs: list[tuple[int | None, int]] = []
    for v in versions:
        if runs and runs[-1][0] == v:
            runs[-1] = (v, runs[-1][1] + 1)
        else:
            runs.append((v, 1))
    return runs


def branch_prefix(trace: Conversation, path: list[int]) -> tuple[list[int] | None, int]:
    """The ids of the nearest turn on ``path`` (node indices from the root down) through its
    completion, and how many nodes of ``path`` they hold (``(None, 0)``: no turn on it has ids).
    What a token-in client builds the next prompt on."""
    turns = _turn_calls(trace)
    if not turns:
        return None, 0
    for k in range(len(path) - 1, -1, -1):
        call = turns.get(path[k])
        if call is not None:
            prompt = full_prompt(trace, call)
            if prompt is None:
                return None, 0
            return prompt + (trace.nodes[path[k]].token_ids or []), k + 1
    return None, 0


def has_tokens(trace: Conversation) -> bool:
    """Whether any call recorded prompt ids (else the trace has no token sequences)."""
    return any(call.prompt_ids is not None for call in trace.calls)


def full_prompt(trace: Conversation, call: ModelCall) -> list[int] | None:
    """The whole prompt ids of ``call`` (``None``: not captured)."""
    if call.prompt_ids is None or call.node is None:
        return None
    previous = _previous_sequence(trace, call.node, _turn_calls(trace))
    return previous[: call.prompt_shared] + call.prompt_ids


def token_drift(trace: Conversation) -> list[int]:
    """The turns, numbered from 0 along their branch, whose prompt did not begin with the
    previous sequence (in node order; a turn on a shared prefix is listed once)."""
    turns = _turn_calls(trace)
    if not turns:
        return []
    nodes = trace.nodes
    nearest: list[int | None] = [None] * len(nodes)  # the nearest turn at or above each node
    depth = [0] * len(nodes)  # the turns at or above each node
    length: dict[int, int] = {}  # a turn's prompt + completion length
    drift = []
    for i, node in enumerate(nodes):
        parent = node.parent
        above, k = (nearest[parent], depth[parent]) if parent is not None and 0 <= parent < i else (None, 0)
        call = turns.get(i)
        if call is not None:
            if call.prompt_shared < (length[above] if above is not None else 0):
                drift.append(k)
            length[i] = call.prompt_shared + len(call.prompt_ids or ()) + len(node.token_ids or ())
            above, k = i, k + 1
        nearest[i], depth[i] = above, k
    return drift


def token_sequences(trace: Conversation) -> list[TokenSequence]:
    """The trace's training sequences: one per branch, more where a turn drifted.

    Raises:
        ValueError: the token record is inconsistent (a call shares more ids than its branch
            has, or a node's logprobs or mask do not match its ids).
    """
    if not has_tokens(trace):
        return []
    turns = _turn_calls(trace)
    result: list[TokenSequence] = []
    ids: list[int] = []
    path = -1
    for b, members, new in sequence_turns(trace, turns, _own_lengths(trace, turns)):
        if b != path:  # a path's first sequence begins at its root
            ids, path = [], b
        ids, mask, logprobs, policy = _assemble(trace, ids, members, turns)
        if new:
            result.append(TokenSequence(b, ids, mask, logprobs, tuple(members), policy))
    return result


Lengths = dict[int, tuple[int, int]]
"""Node → the counts of its call's prompt ids and of its completion ids."""


def sequence_turns(
    trace: Conversation, turns: dict[int, ModelCall], lengths: Lengths
) -> Iterator[tuple[int, list[int], bool]]:
    """Each sequence's branch and turns, path by path (leaves in node order), and whether it is
    new: a sequence on a prefix that branches share is new on the first. ``token_sequences``
    keeps the new ones, in this order. Only ``lengths`` and ``prompt_shared`` decide where a
    sequence ends, so a trace whose ids are stored elsewhere is walked the same way.

    Raises:
        ValueError: a call shares more prompt ids than its branch has before it.
    """
    seen: set[tuple[int, int]] = set()
    for b, leaf in enumerate(leaves(trace)):
        for members in _branch_runs(trace, path_to(trace, leaf), turns, lengths):
            key = (members[0], members[-1])
            yield b, members, key not in seen
            seen.add(key)


# -- internals --------------------------------------------------------------------------------


def _turn_calls(trace: Conversation) -> dict[int, ModelCall]:
    """Node index → the call that sampled it, for the turns with prompt and completion ids."""
    nodes = trace.nodes
    turns: dict[int, ModelCall] = {}
    for call in trace.calls:
        i = call.node
        if call.prompt_ids is not None and i is not None and 0 <= i < len(nodes) and nodes[i].token_ids is not None:
            turns[i] = call
    return turns


def _previous_sequence(trace: Conversation, node: int, turns: dict[int, ModelCall]) -> list[int]:
    """Prompt + completion ids of the nearest turn above ``node`` (``[]``: none)."""
    ids: list[int] = []
    for i in path_to(trace, node)[:-1]:
        call = turns.get(i)
        if call is not None:
            del ids[call.prompt_shared :]
            ids += call.prompt_ids or ()
            ids += trace.nodes[i].token_ids or ()
    return ids


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the prefix property: one comparison in C
        return n
    return next(k for k in range(n) if a[k] != b[k])


def _own_lengths(trace: Conversation, turns: dict[int, ModelCall]) -> Lengths:
    return {i: (len(call.prompt_ids or ()), len(trace.nodes[i].token_ids or ())) for i, call in turns.items()}


def _branch_runs(
    trace: Conversation, path: list[int], turns: dict[int, ModelCall], lengths: Lengths
) -> Iterator[list[int]]:
    """The turns of each sequence along ``path``: a new one where a turn drifted."""
    length = 0  # of the current sequence
    members: list[int] = []
    for i in path:
        call = turns.get(i)
        if call is None:
            continue
        shared = call.prompt_shared
        if shared > length:
            raise ValueError(
                f"trace {trace.id}: the call of node {i} shares {shared} prompt ids, but its branch "
                f"has {length} before it; the token record is inconsistent"
            )
        if shared < length:  # drift: a new sequence, from the prompt the server saw
            yield members
            members = []
        prompt, completion = lengths[i]
        length = shared + prompt + completion
        members.append(i)
    if members:
        yield members


def _assemble(
    trace: Conversation, previous: list[int], members: list[int], turns: dict[int, ModelCall]
) -> tuple[list[int], list[int], list[float], list[int | None]]:
    """A sequence's ids, loss mask, logprobs and versions: the ids it shares with the
    ``previous`` one on its path (prompt: mask 0, logprob 0.0, no version), then each turn's
    new prompt ids and completion."""
    shared = turns[members[0]].prompt_shared
    ids, mask, logprobs = previous[:shared], [0] * shared, [0.0] * shared
    policy: list[int | None] = [None] * shared
    for i in members:
        prompt = turns[i].prompt_ids or []
        ids += prompt
        mask += [0] * len(prompt)
        logprobs += [0.0] * len(prompt)
        policy += [None] * len(prompt)
        node = trace.nodes[i]
        completion = node.token_ids or []
        ids += completion
        mask += _completion_mask(trace, i, node)
        logprobs += _completion_logprobs(trace, i, node)
        policy += completion_versions(turns[i], len(completion))
    return ids, mask, logprobs, policy


def _completion_mask(trace: Conversation, i: int, node: MessageNode) -> list[int]:
    size = len(node.token_ids or ())
    if node.mask is None:
        return [1] * size
    if len(node.mask) != size:
        raise ValueError(f"trace {trace.id}: node {i} has {len(node.mask)} mask values for {size} ids")
    return [int(m) for m in node.mask]


def _completion_logprobs(trace: Conversation, i: int, node: MessageNode) -> list[float]:
    size = len(node.token_ids or ())
    if node.logprobs is None:
        return [math.nan] * size
    if len(node.logprobs) != size:
        raise ValueError(f"trace {trace.id}: node {i} has {len(node.logprobs)} logprobs for {size} ids")
    return node.logprobs
