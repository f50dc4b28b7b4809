"""The parts of a Trace: time spans, the error record, rewards, the conversation's nodes and
model calls, the task, agent and runtime info, tool calls.

Plain ``msgspec.Struct``s that ``trace.py`` assembles into the ``Trace`` (and re-exports).
Each evolves by appending fields with defaults at its end (``TRACE_VERSION``).
"""

from __future__ import annotations

import builtins
import functools
import importlib.metadata
import traceback as tb
from typing import Any

import msgspec

from .._errors import ProviderError, error_class
from .messages import Message, Usage


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
        return {
            "boot": self.boot,
            "setup": self.setup,
            "agent": self.agent,
            "finalize": self.finalize,
            "scoring": self.scoring,
        }

    def end_open_spans(self, now: float) -> None:
        """End at ``now`` every span that started and has not ended."""
        for span in self.spans().values():
            if span.start and not span.end:
                span.end = now


class ErrorRecord(msgspec.Struct):
    """A recorded failure: the exception's type name, message, status, traceback and lineage.

    ``is_a`` is the one way to ask what kind of failure it was.
    """

    type: str
    message: str
    status_code: int | None = None
    traceback: str | None = None
    lineage: list[str] | None = None
    """The names of the exception's classes, its own first, up to ``BaseException`` (``None``:
    recorded before lineages were; ``is_a`` then resolves ``type`` in this process)."""

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorRecord:
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
            lineage=[c.__name__ for c in type(exc).__mro__[:-1]],  # all but ``object``
        )

    def is_a(self, kind: builtins.type[BaseException] | tuple[builtins.type[BaseException], ...]) -> bool:
        """Whether the recorded exception was a ``kind`` (a class, or a tuple of them, as for
        ``isinstance``). Read from the lineage, so it holds in a process that never imported
        the class that was raised (a taskset's own subclass of ``ProviderError``, say)."""
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if self.lineage is not None:
            return any(k.__name__ in self.lineage for k in kinds)
        found = error_class(self.type)
        return found is not None and issubclass(found, kinds)


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
    original_chars: int | None = None
    """The characters of the message's texts as it arrived, when a text was cut at the cap
    (``capped.py``); ``None``: recorded whole."""
    original_digest: bytes | None = None
    """``message_hash`` of the message as it arrived, when it was cut: later requests, which
    carry it whole, still match it."""
    is_content: list[bool] = msgspec.field(default_factory=list)
    """Per id of ``token_ids``, whether it is the message's own content rather than chat
    template scaffold (upstream's renderer attribution); empty when not attributed, as it is
    for every node recorded here (the proxy sees the server's ids, not the renderer's)."""


class ModelCall(msgspec.Struct):
    """One real upstream exchange; ``node`` is the sampled node it committed, if any."""

    node: int | None = None
    model: str | None = None
    sampling: dict[str, Any] | None = None
    endpoint: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    time: TimeSpan = msgspec.field(default_factory=TimeSpan)
    error: ErrorRecord | None = None
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
    token_policy: list[tuple[int | None, int]] | None = None
    """The policy version of each completion id, run-length encoded: ``(version, count)`` in
    order (a call interrupted by a weight update and continued has one run per version);
    ``None``: every id has ``policy`` (``tokens.completion_versions``)."""
    interrupts: int = 0
    """How many times the call was interrupted (``Driver.paused(interrupt=True)``) and continued."""
    dropped: dict[str, str] | None = None
    """Request fields the harness sent that did not go upstream, each with why
    (``_core/upstream_fields``)."""
    tools_digest: str | None = None
    """The digest of the request's tools (``branching.tools_digest``; ``None``: no tools): a
    branch whose tools differ from the main branch's is a sub-agent's, and a turn is built on
    an earlier turn's ids only if their tools are the same."""


class TraceTask(msgspec.Struct):
    """The task as seeded; never rewritten by interceptors."""

    type: str
    key: str | None = None
    hash: str | None = None
    idx: int | None = None
    data: dict[str, Any] = msgspec.field(default_factory=dict)
    data_cls: str | None = None
    """``module:QualName`` of the row's ``TaskData`` class: with ``data`` it rebuilds the row
    (the interception's ``GET /task`` answers both, as upstream's ``cls`` and ``task``)."""


class VersionInfo(msgspec.Struct):
    """The build that recorded a trace: the ``rollout_ray`` version (upstream records its
    ``verifiers`` build under the same name)."""

    version: str
    commit: str | None = None


@functools.cache
def current_build() -> VersionInfo:
    """This process's ``rollout_ray`` build, read once (package metadata is a file read)."""
    try:
        return VersionInfo(version=importlib.metadata.version("rollout_ray"))
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return VersionInfo(version="unknown")


class RuntimeInfo(msgspec.Struct):
    """Which runtime ran the rollout, and whether the rollout borrowed it."""

    id: str
    type: str
    name: str
    borrowed: bool = False
    image: str | None = None
    """The digest of the image it ran over (``TaskData.image``), if any."""
    snapshot: str | None = None
    """The setup snapshot it started from (``Task.setup_shareable``): the group's setup ran
    in another sample's runtime; ``None`` when it ran its own."""


class AgentInfo(msgspec.Struct):
    """Harness, model and runtime of the run."""

    harness: str = ""
    model: str | None = None
    runtime: RuntimeInfo | None = None
    name: str = "agent"
    trainable: bool = True


class ToolCallRecord(msgspec.Struct):
    """One tool call: toolset (``server``), tool, JSON arguments, outcome, seconds taken.

    ``arguments`` and ``error`` keep at most ``capped.MAX_TOOL_CALL_CHARS`` characters each
    (a marker ends a cut one).
    """

    server: str
    name: str
    arguments: str
    ok: bool
    error: str | None = None
    duration: float = 0.0
    arguments_chars: int | None = None
    """The length of the arguments' JSON when it was cut; ``None``: recorded whole."""


class UserTurn(msgspec.Struct):
    """One turn of a simulated user (``Task.user_simulator``): what it said and who said it.

    Kept apart from the policy's record: its model call is here, never in ``Trace.calls``, so
    it is outside the token limits and the loss mask; ``node`` links it to the user message the
    agent received in the conversation graph.
    """

    by: str
    """The simulator's name (``UserSimulator.name``)."""
    content: str
    done: bool = False
    """The simulator ended the conversation with this turn (the agent never receives it)."""
    node: int | None = None
    """The graph node of the user message the agent received (``None``: not received)."""
    call: ModelCall | None = None
    """The simulator's own model call, if it has a model (a scripted user has none)."""
    agent_node: int | None = None
    """When another policy agent of the rollout said it (``PeerAgent``): the sampled node of
    its reply, on that agent's own branch of the graph (its call is then in ``Trace.calls``)."""
