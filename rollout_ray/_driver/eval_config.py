"""EvalConfig: how a run is driven (the user's settings for ``Driver``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_serializer

from .._core.limits import RolloutLimits, RolloutTimeouts
from .bounded_call import JUDGE_TIMEOUT
from .finalize import FinalizeConfig

KeepGroup = Literal["nonzero_std"] | Callable[[pa.Table], bool]
"""A rule on a finalized group's samples table: ``True`` streams the group (``keep_rule``)."""


class EvalConfig(BaseModel):
    """How a run is driven (user config)."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True, use_attribute_docstrings=True)

    samples_per_task: int = Field(1, ge=1)
    """n: rollouts per task; the samples of one task form a group."""
    max_in_flight: Annotated[int, Field(ge=1)] | Literal["auto"] = 64
    """Rollouts running at once (backpressure). ``"auto"``: as many as keep the model's servers
    at their saturation point, read from their ``/metrics`` (``auto_in_flight``)."""
    max_infra_retries: int = Field(2, ge=0)
    """Retries of a rollout whose host died."""
    retry_failed: bool = False
    """Also retry rollouts that failed inside (task or harness errors), up to the same count."""
    breaker: int = Field(10, ge=1)
    """Consecutive provider failures that halt the run."""
    rows_per_shard: int = Field(1000, ge=1)
    """Rows per Parquet shard, at most: finalized groups are written when this many are
    buffered, or 2 s after the first of them was (``group_finalizer.WRITE_WITHIN``), or 64 MiB of them."""
    stream_buffer: int = Field(64, ge=1)
    """Finalized groups waiting for the consumer before the finalizer waits too."""
    finished_buffer: int = Field(256, ge=1)
    """Finished groups waiting to be finalized, stored and streamed, at most. When the finalizer
    (or the consumer behind it) falls behind, a rollout that finishes a group keeps its slot
    until there is room, so admission waits: the driver's memory is flat however many tasks."""
    runtime: str | None = None
    """The runtime kind (a provider's name, or ``"auto"``) of the rollouts whose task names
    none (``TaskData.runtime``); ``None``: the executor's (``--runtime``)."""
    limits: RolloutLimits = RolloutLimits()
    timeouts: RolloutTimeouts = RolloutTimeouts()
    model_name: str | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    finalize: FinalizeConfig = FinalizeConfig()
    max_staleness: int | None = Field(None, ge=0)
    """Versions a rollout may lag the policy when its group is handed to the consumer,
    counted from its first model call. With ``batch_groups``, admission keeps rollouts from
    running further ahead (``admission``); one that still ends older is handled as
    ``stale_samples`` says (0: synchronous on-policy). ``None``: no bound."""
    batch_groups: int | None = Field(None, ge=1)
    """The trainer's batch: groups it takes from the stream per policy version (one step).
    ``max_staleness`` admits by it; without it, staleness is only checked at the end."""
    stale_samples: Literal["rerun", "mask"] = "rerun"
    """A sample older than ``max_staleness`` when its group is handed on: ``"rerun"`` drops
    it and runs it again; ``"mask"`` keeps it in its group (its reward counts in the group's
    baseline) with its tokens masked from the loss (``Group.batch``'s ``masked``)."""
    keep_group: KeepGroup | None = None
    """Which finalized groups are streamed: ``"nonzero_std"`` (rewards that differ: a signal
    to learn from), or a callable on the group's samples table. A group it refuses is
    stored with the reason (the summary's ``rejected``), not streamed, and another task is
    admitted in its place (``max_groups``)."""
    max_groups: int | None = Field(None, ge=1)
    """Groups to stream, then end the run. Tasks are admitted, in taskset order, only while
    the groups admitted and not rejected are fewer: a rejected group is replaced by the next
    task, and a taskset longer than needed (an iterator) is read no further. ``None``: every task."""
    judge_timeout: float = Field(JUDGE_TIMEOUT, gt=0)
    """Seconds the group judge may take on one group; past it the group's ``judge_error``
    says so and the run goes on (``_driver/bounded_call``)."""

    @field_serializer("keep_group", when_used="json")
    def _keep_group_name(self, rule: KeepGroup | None) -> str | None:
        if rule is None or isinstance(rule, str):
            return rule
        return getattr(rule, "__qualname__", type(rule).__qualname__)
