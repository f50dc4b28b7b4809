"""The Trace: the one record of one rollout, and the only one that crosses processes.

Every part is a ``msgspec.Struct`` so a trace is msgpack-encoded between actors and converted
to Arrow in the driver. Aggregates (``reward``, ``num_turns``, token counts) are properties,
recomputed from the stored parts and never serialised, exactly as upstream (§3, B49).

The conversation is a graph (``graph.py``): each ``MessageNode`` names its ``parent``; a
branch is a root-to-leaf path. A linear chat is one branch. The parts are defined in
``trace_parts.py`` and re-exported here.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from .branching import branch_reasons
from .graph import Branch, branches, leaves, path_to
from .messages import AssistantMessage, Message, Tool, ToolMessage, Usage, text_of
from .tokens import token_drift
from .trace_parts import AgentInfo as AgentInfo
from .trace_parts import AgentSpan as AgentSpan
from .trace_parts import ErrorRecord as ErrorRecord
from .trace_parts import InterceptRecord as InterceptRecord
from .trace_parts import MessageNode as MessageNode
from .trace_parts import ModelCall as ModelCall
from .trace_parts import Reward as Reward
from .trace_parts import RuntimeInfo as RuntimeInfo
from .trace_parts import TimeSpan as TimeSpan
from .trace_parts import TimeSplit as TimeSplit
from .trace_parts import Timing as Timing
from .trace_parts import ToolCallRecord as ToolCallRecord
from .trace_parts import TraceTask as TraceTask
from .trace_parts import UserTurn as UserTurn
from .trace_parts import VersionInfo as VersionInfo
from .trace_parts import current_build

RECORD_FLOAT_DECIMALS = 4
"""Digits kept of per-token floats in ``to_record`` (upstream's default): a logprob within
1e-4 of what the trainer saw, and far fewer bytes."""

# WARNING: bump only for an incompatible change; the schema otherwise evolves by appending
# fields with defaults at the end of a struct, never by retyping or reordering.
TRACE_VERSION = 1

LIMIT_STOPS = frozenset({"max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "context_length"})


@dataclass(frozen=True)
class TraceCounts:
    """The aggregates the limits read, as ``Trace.counts()`` computes them in one pass."""

    num_turns: int
    """Sampled assistant nodes."""
    num_input_tokens: int
    """New input tokens, each call counted once across branches."""
    num_output_tokens: int
    """Completion tokens summed per branch (shared calls count once per branch, Q18)."""
    num_total_tokens: int
    """Σ over branches of the total tokens of the branch's last call with usage."""


def _new_id() -> str:
    return uuid.uuid4().hex


class Trace(msgspec.Struct, kw_only=True):
    """The record of one agent run on one task."""

    version: int = TRACE_VERSION
    id: str = msgspec.field(default_factory=_new_id)
    task: TraceTask
    agent: AgentInfo = msgspec.field(default_factory=AgentInfo)
    tools: list[Tool] = msgspec.field(default_factory=list)
    nodes: list[MessageNode] = msgspec.field(default_factory=list)
    calls: list[ModelCall] = msgspec.field(default_factory=list)
    request_rewrites: list[InterceptRecord] = msgspec.field(default_factory=list)
    response_rewrites: list[InterceptRecord] = msgspec.field(default_factory=list)
    rewards: dict[str, Reward | None] = msgspec.field(default_factory=dict)
    metrics: dict[str, float | None] = msgspec.field(default_factory=dict)
    info: dict[str, Any] = msgspec.field(default_factory=dict)
    is_completed: bool = False
    ok: bool = False
    stop_condition: str | None = None
    errors: list[ErrorRecord] = msgspec.field(default_factory=list)
    timing: Timing = msgspec.field(default_factory=Timing)
    tool_calls: list[ToolCallRecord] = msgspec.field(default_factory=list)
    extra_usage: list[Usage] = msgspec.field(default_factory=list)
    """Usage of model calls made outside the agent's conversation (judges, through
    ``record_judge_call``); not in ``usage``, which sums the agent's calls, as upstream."""
    verifiers: VersionInfo = msgspec.field(default_factory=current_build)
    """The build that recorded the trace (a trace read back keeps its recorded one)."""
    user_turns: list[UserTurn] = msgspec.field(default_factory=list)
    """A simulated user's turns (``Task.user_simulator``), apart from the policy's calls."""
    state: dict[str, Any] = msgspec.field(default_factory=dict)
    """The rollout's shared state (upstream's ``Trace.state``) as a JSON object: what setup,
    hooks and stateful tools write; read and replaced over the proxy's ``/state`` route. Kept
    in the record (upstream's leaves it out) so a rescore or a reader sees what was scored."""

    # -- derived views (never serialised) ---------------------------------------------------

    @property
    def reward(self) -> float:
        """Σ score·weight over the rewards that were scored (B49)."""
        return sum(r.score * r.weight for r in self.rewards.values() if r is not None)

    @property
    def last_error(self) -> ErrorRecord | None:
        return self.errors[-1] if self.errors else None

    @property
    def has_error(self) -> bool:
        """True unless the rollout finished ``ok`` (upstream: ``not ok``)."""
        return not self.ok

    @property
    def last_message(self) -> Message:
        """The most recently stored message (the last node, whatever its branch).

        Raises:
            ValueError: the trace has no messages yet.
        """
        if not self.nodes:
            raise ValueError("trace has no messages")
        return self.nodes[-1].message

    @property
    def transcript(self) -> str:
        """The last branch as text, one ``[role]`` block per message; tool outputs are
        omitted, tool calls are shown as ``[tool_call name(arguments)]`` (upstream's form)."""
        blocks: list[str] = []
        for message in self.messages:
            lines = [f"[{message.role}]"]
            if isinstance(message, AssistantMessage):
                if text := text_of(message.content):
                    lines.append(text)
                lines.extend(f"[tool_call {c.name}({c.arguments})]" for c in message.tool_calls or [])
            else:
                if isinstance(message, ToolMessage) and message.name:
                    lines[0] = f"[{message.role} {message.name}]"
                if text := text_of(message.content):
                    lines.append(text)
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)

    def to_record(self, float_decimals: int | None = RECORD_FLOAT_DECIMALS) -> dict[str, Any]:
        """The trace as JSON-ready builtins (bytes as base64), per-token floats rounded to
        ``float_decimals`` (``None`` keeps every digit). The msgpack wire stays lossless."""
        record: dict[str, Any] = msgspec.to_builtins(self)
        if float_decimals is not None:
            for node in record["nodes"]:
                for name in ("logprobs", "advantages"):
                    if node.get(name) is not None:
                        node[name] = [round(v, float_decimals) for v in node[name]]
        return record

    @property
    def stopped(self) -> bool:
        return self.stop_condition is not None

    def counts(self) -> TraceCounts:
        """Turns and the three token aggregates, computed together in one pass (B33, §3).

        The limits read all four before every model call, so they are computed in
        O(nodes + calls), from each node's parent, never by rebuilding the branches.
        """
        nodes = self.nodes
        size = len(nodes)
        calls_at: dict[int, list[ModelCall]] = {}
        for call in self.calls:
            if call.node is not None and 0 <= call.node < size:
                calls_at.setdefault(call.node, []).append(call)
        # Per node, over the path from the root to it: the total tokens of the last call with
        # usage (0 if none), and the completion tokens of its calls.
        last_total = [0] * size
        output = [0] * size
        has_child = [False] * size
        turns = input_tokens = 0
        for i, node in enumerate(nodes):
            parent = node.parent
            previous, produced = 0, 0
            if parent is not None and 0 <= parent < size:
                has_child[parent] = True
                if parent < i:  # always, as the graph appends: a parent precedes its children
                    previous, produced = last_total[parent], output[parent]
            for call in calls_at.get(i, ()):
                if call.usage is not None:
                    # Each call counts once: shared prefixes of branches are shared nodes.
                    input_tokens += max(0, call.usage.input_tokens - previous)
                    previous = call.usage.total_tokens
                    produced += call.usage.completion_tokens
            last_total[i], output[i] = previous, produced
            turns += node.sampled
        leaves = [i for i in range(size) if not has_child[i]]
        return TraceCounts(
            num_turns=turns,
            num_input_tokens=input_tokens,
            num_output_tokens=sum(output[i] for i in leaves),
            num_total_tokens=sum(last_total[i] for i in leaves),
        )

    @property
    def branches(self) -> list[Branch]:
        """One branch per leaf, leaves in node order."""
        return branches(self)

    @property
    def num_branches(self) -> int:
        return len(leaves(self))

    @property
    def branch_reasons(self) -> list[str]:
        """Why each branch of ``branches`` exists: ``main``, ``subagent``, ``compaction``,
        ``resample`` or ``edit`` (``branching.py``)."""
        return branch_reasons(self)

    @property
    def messages(self) -> list[Message]:
        """The messages of the last branch."""
        ends = leaves(self)
        return [self.nodes[i].message for i in path_to(self, ends[-1])] if ends else []

    @property
    def num_turns(self) -> int:
        """Sampled assistant nodes."""
        return sum(1 for n in self.nodes if n.sampled)

    @property
    def num_input_tokens(self) -> int:
        """New input tokens, each call counted once across branches."""
        return self.counts().num_input_tokens

    @property
    def num_output_tokens(self) -> int:
        """Completion tokens summed per branch (shared calls count once per branch, Q18)."""
        return self.counts().num_output_tokens

    @property
    def num_total_tokens(self) -> int:
        """Σ over branches of the total tokens of the branch's last call with usage."""
        return self.counts().num_total_tokens

    @property
    def usage(self) -> Usage:
        """Usage over every call that reported it, including failed and uncommitted ones."""
        return aggregate_usage([c.usage for c in self.calls if c.usage is not None])

    @property
    def token_drift(self) -> list[int]:
        """Turns (0-based along their branch) whose prompt re-tokenized the turn before."""
        return token_drift(self)

    @property
    def is_truncated(self) -> bool:
        if self.stop_condition in LIMIT_STOPS:
            return True
        clean = [c for c in self.calls if c.error is None]
        return bool(clean) and clean[-1].finish_reason == "length"

    @property
    def assistant_messages(self) -> list[AssistantMessage]:
        return [n.message for n in self.nodes if n.sampled]  # type: ignore[misc]

    @property
    def tool_messages(self) -> list[ToolMessage]:
        return [n.message for n in self.nodes if isinstance(n.message, ToolMessage)]

    @property
    def last_reply(self) -> str:
        replies = self.assistant_messages
        return text_of(replies[-1].content).strip() if replies else ""

    # -- mutators ---------------------------------------------------------------------------

    def stop(self, condition: str) -> None:
        """Mark the trace completed; the first stop condition wins."""
        self.is_completed = True
        if self.stop_condition is None:
            self.stop_condition = condition

    def record_error(self, exc: BaseException) -> None:
        """Append ``exc`` as an ``ErrorRecord``, mark the trace not ok, and stop it with ``error``."""
        self.errors.append(ErrorRecord.from_exception(exc))
        self.ok = False
        self.stop("error")

    def record_metric(self, name: str, value: float) -> None:
        self.metrics[name] = float(value)

    def record_metrics(self, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.record_metric(name, value)

    def record_reward(self, name: str, value: float, weight: float = 1.0) -> None:
        self.rewards[name] = Reward(float(value), float(weight))

    def record_judge_call(self, *, name: str, request: Mapping[str, Any], response: Any) -> None:
        """Record one judge exchange in ``info["judge_calls"]`` and its usage in ``extra_usage``.

        ``response`` has ``text`` and optional ``usage`` (upstream's ``JudgeResponse``, or a
        mapping of the same keys); further keys (``parsed``) are kept beside the message.
        """
        fields = dict(response) if isinstance(response, Mapping) else response.model_dump()
        text = fields.pop("text")
        usage = fields.get("usage")
        if usage is not None:
            usage = usage if isinstance(usage, Usage) else msgspec.convert(usage, Usage, from_attributes=True)
            fields["usage"] = msgspec.to_builtins(usage)
        self.info.setdefault("judge_calls", []).append(
            {
                "name": name,
                "request": copy.deepcopy(dict(request)),
                "response": {"message": msgspec.to_builtins(AssistantMessage(content=text)), **fields},
            }
        )
        if usage is not None:
            self.extra_usage.append(usage)

    def split_agent_time(self) -> None:
        """Split the agent span into model time (Σ call durations, clamped) and the rest."""
        agent = self.timing.agent
        if not agent.end:
            return
        model = min(sum(c.time.duration for c in self.calls), agent.duration)
        agent.model = TimeSplit(model)
        agent.harness = TimeSplit(agent.duration - model)


def aggregate_usage(usages: list[Usage]) -> Usage:
    """Sum usages; an optional field is summed over the entries that report it, else None."""

    def optional(name: str) -> Any:
        values = [getattr(u, name) for u in usages if getattr(u, name) is not None]
        return sum(values) if values else None

    return Usage(
        prompt_tokens=sum(u.prompt_tokens for u in usages),
        completion_tokens=sum(u.completion_tokens for u in usages),
        cached_input_tokens=optional("cached_input_tokens"),
        reasoning_tokens=optional("reasoning_tokens"),
        cost=optional("cost"),
    )


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Trace)


def encode_trace(trace: Trace) -> bytes:
    """Encode a trace for the wire (msgpack)."""
    return _ENCODER.encode(trace)


def decode_trace(data: bytes) -> Trace:
    """Decode a trace encoded by ``encode_trace``."""
    return _DECODER.decode(data)
