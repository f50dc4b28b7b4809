"""The Trace: the one record of one rollout, and the only one that crosses processes.

Every part is a ``msgspec.Struct`` so a trace is msgpack-encoded between actors and converted
to Arrow in the driver. Aggregates (``reward``, ``num_turns``, token counts) are properties,
recomputed from the stored parts and never serialised, exactly as upstream (§3, B49).

The conversation is a graph: each ``MessageNode`` names its ``parent``; a branch is a
root-to-leaf path. A linear chat is one branch.
"""

from __future__ import annotations

import traceback as tb
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from .._errors import ProviderError
from .messages import AssistantMessage, Message, Tool, ToolMessage, Usage, text_of

# WARNING: bump only for an incompatible change; the schema otherwise evolves by appending
# fields with defaults at the end of a struct, never by retyping or reordering.
TRACE_VERSION = 1

LIMIT_STOPS = frozenset(
    {"max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "context_length"}
)


class TimeSpan(msgspec.Struct):
    """Wall-clock epoch seconds; ``0/0`` means the span never started."""

    start: float = 0.0
    end: float = 0.0

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start) if self.end else 0.0


class TimeSplit(msgspec.Struct):
    """A share of the agent span (seconds)."""

    duration: float = 0.0


class AgentSpan(msgspec.Struct):
    """The agent span, split into time in model calls and the rest (harness)."""

    start: float = 0.0
    end: float = 0.0
    model: TimeSplit = msgspec.field(default_factory=TimeSplit)
    harness: TimeSplit = msgspec.field(default_factory=TimeSplit)

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start) if self.end else 0.0


class Timing(msgspec.Struct):
    """The five spans of a rollout (B45)."""

    start: float = 0.0
    boot: TimeSpan = msgspec.field(default_factory=TimeSpan)
    setup: TimeSpan = msgspec.field(default_factory=TimeSpan)
    agent: AgentSpan = msgspec.field(default_factory=AgentSpan)
    finalize: TimeSpan = msgspec.field(default_factory=TimeSpan)
    scoring: TimeSpan = msgspec.field(default_factory=TimeSpan)

    def spans(self) -> dict[str, TimeSpan | AgentSpan]:
        return {"boot": self.boot, "setup": self.setup, "agent": self.agent,
                "finalize": self.finalize, "scoring": self.scoring}

    def end_open_spans(self, now: float) -> None:
        """End at ``now`` every span that started and has not ended."""
        for span in self.spans().values():
            if span.start and not span.end:
                span.end = now


class Error(msgspec.Struct):
    """A recorded failure: the exception's type name, message, status and traceback."""

    type: str
    message: str
    status_code: int | None = None
    traceback: str | None = None

    @classmethod
    def from_exception(cls, exc: BaseException) -> Error:
        # A provider error's traceback is ours, not the provider's: it says nothing useful.
        trace_text = None
        if not isinstance(exc, ProviderError):
            trace_text = "".join(tb.format_exception(exc))
        status = getattr(exc, "status_code", None)
        return cls(
            type=type(exc).__name__,
            message=str(exc),
            status_code=status if isinstance(status, int) else None,
            traceback=trace_text,
        )


class Reward(msgspec.Struct):
    """A scored reward and its weight in ``Trace.reward``."""

    score: float
    weight: float = 1.0


class InterceptRecord(msgspec.Struct):
    """One rewrite made by an ``@intercept`` hook."""

    handler: str


class MessageNode(msgspec.Struct):
    """One message in the conversation graph.

    ``sampled`` is True only for an assistant message the model produced here; prompt-supplied
    assistant messages are not turns.
    """

    parent: int | None
    message: Message
    sampled: bool = False
    timestamp: float = 0.0
    token_ids: list[int] | None = None
    """A sampled node's completion ids as the server sampled them (``None``: not captured)."""
    logprobs: list[float] | None = None
    """The sampling log-probability of each of ``token_ids``."""
    advantages: list[float] | None = None
    mask: list[bool] | None = None
    """Per id of ``token_ids``, whether it counts in the loss; ``None``: all of them."""


class ModelCall(msgspec.Struct):
    """One real upstream exchange; ``node`` is the sampled node it committed, if any."""

    node: int | None = None
    model: str | None = None
    sampling: dict[str, Any] | None = None
    endpoint: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    time: TimeSpan = msgspec.field(default_factory=TimeSpan)
    error: Error | None = None
    policy: int | None = None
    """The policy version that produced the reply, when the model side stamped one."""
    prompt_shared: int = 0
    """Leading prompt ids equal to the previous turn's ids on the branch (``tokens.py``)."""
    prompt_ids: list[int] | None = None
    """The prompt ids after the ``prompt_shared`` ones (``None``: not captured)."""
    stored_ids: tuple[int, int] | None = None
    """Only in a run table's ``trace`` blob (schema version 3): this turn's ``prompt_ids`` and
    its node's ``token_ids`` (and ``logprobs``, when float32 holds them) are kept once, in the
    table's token columns, and this counts them; the reader puts them back (``token_store.py``)."""


class TraceTask(msgspec.Struct):
    """The task as seeded; never rewritten by interceptors."""

    type: str
    key: str | None = None
    hash: str | None = None
    idx: int | None = None
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class RuntimeInfo(msgspec.Struct):
    """Which runtime ran the rollout, and whether the rollout borrowed it."""

    id: str
    type: str
    name: str
    borrowed: bool = False


class AgentInfo(msgspec.Struct):
    """Harness, model and runtime of the run."""

    harness: str = ""
    model: str | None = None
    runtime: RuntimeInfo | None = None
    name: str = "agent"
    trainable: bool = True


class ToolCallRecord(msgspec.Struct):
    """One tool call: toolset (``server``), tool, JSON arguments, outcome, seconds taken."""

    server: str
    name: str
    arguments: str
    ok: bool
    error: str | None = None
    duration: float = 0.0


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


@dataclass(frozen=True)
class Branch:
    """A root-to-leaf path: its node indices and the calls that committed a node on it."""

    nodes: tuple[int, ...]
    calls: tuple[ModelCall, ...]


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
    errors: list[Error] = msgspec.field(default_factory=list)
    timing: Timing = msgspec.field(default_factory=Timing)
    tool_calls: list[ToolCallRecord] = msgspec.field(default_factory=list)
    extra_usage: list[Usage] = msgspec.field(default_factory=list)
    """Usage off the conversation graph (a judge's)."""

    # -- derived views (never serialised) ---------------------------------------------------

    @property
    def reward(self) -> float:
        """Σ score·weight over the rewards that were scored (B49)."""
        return sum(r.score * r.weight for r in self.rewards.values() if r is not None)

    @property
    def has_error(self) -> bool:
        return not self.ok

    @property
    def last_error(self) -> Error | None:
        return self.errors[-1] if self.errors else None

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

    def _leaves(self) -> list[int]:
        has_child = [False] * len(self.nodes)
        for node in self.nodes:
            if node.parent is not None and 0 <= node.parent < len(self.nodes):
                has_child[node.parent] = True
        return [i for i, parent in enumerate(has_child) if not parent]

    def _path(self, leaf: int) -> list[int]:
        path: list[int] = []
        node: int | None = leaf
        while node is not None and len(path) <= len(self.nodes):  # a bad parent link cannot loop
            path.append(node)
            node = self.nodes[node].parent
        path.reverse()
        return path

    @property
    def branches(self) -> list[Branch]:
        """One branch per leaf, leaves in node order."""
        calls_at: dict[int, list[ModelCall]] = {}
        for call in self.calls:
            if call.node is not None:
                calls_at.setdefault(call.node, []).append(call)
        result = []
        for leaf in self._leaves():
            path = self._path(leaf)
            calls = tuple(c for i in path for c in calls_at.get(i, ()))
            result.append(Branch(tuple(path), calls))
        return result

    @property
    def num_branches(self) -> int:
        return len(self._leaves())

    @property
    def messages(self) -> list[Message]:
        """The messages of the last branch."""
        leaves = self._leaves()
        return [self.nodes[i].message for i in self._path(leaves[-1])] if leaves else []

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
        from .tokens import token_drift  # tokens.py reads these structs

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
        """Append ``exc`` as an Error, mark the trace not ok, and stop it with ``error``."""
        self.errors.append(Error.from_exception(exc))
        self.ok = False
        self.stop("error")

    def record_metric(self, name: str, value: float) -> None:
        self.metrics[name] = float(value)

    def record_metrics(self, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.record_metric(name, value)

    def record_reward(self, name: str, value: float, weight: float = 1.0) -> None:
        self.rewards[name] = Reward(float(value), float(weight))

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
