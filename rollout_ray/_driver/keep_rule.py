"""Which finalized groups reach the trainer: the keep rule, and the one loss that refuses a group.

Every group is finalized and stored; a group is kept from the stream (``Driver.groups``)
only by one of these stated rules, and its reason is stored in the group summary's
``rejected`` column (null for a streamed group):

- a sample *lost* to the infrastructure on its last attempt (``max_infra_retries`` spent; one
  loss within them costs nothing: the sample runs again and the group streams complete). Its
  outcome says nothing of the task, and as reward 0 in its siblings' baseline it would teach
  the policy the machine's failure. A resume runs it again.
- ``keep_group="nonzero_std"``: the group's rewards do not differ (std 0, or undefined), so
  every advantage is 0 and the group carries no signal.
- ``keep_group=callable``: called with the group's finalized samples table; false refuses it.

A refused group's place is taken by the next task when the run wants a number of groups
(``EvalConfig.max_groups``): over-sampling until the batch is full.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pyarrow as pa

from .._errors import InfrastructureLost
from .._record.arrow import RolloutRecord
from .eval_config import KeepGroup


def lost_on_last_attempt(record: RolloutRecord) -> bool:
    """Whether the stored attempt of ``record`` was lost (earlier attempts' losses were retried)."""
    return not record.trace.ok and any(e.is_a(InfrastructureLost) for e in record.attempt_errors()[-1])


def rejections(
    batch: Iterable[tuple[str, list[RolloutRecord]]],
    summaries: pa.Table,
    samples_of: Callable[[str], pa.Table],
    rule: KeepGroup | None,
) -> dict[str, str]:
    """The reason each refused group of ``batch`` is kept from the stream (see the module).

    Args:
        batch: each group's id and members.
        summaries: the finalized summary rows of the batch (``group_id``, ``std``).
        samples_of: a group's finalized samples, by id (asked of a callable rule only).
        rule: ``EvalConfig.keep_group``.
    """
    reasons: dict[str, str] = {}
    for group_id, members in batch:
        gone = [r.sample_idx for r in members if lost_on_last_attempt(r)]
        if gone:
            reasons[group_id] = (
                f"lost: sample(s) {gone} lost to the infrastructure on every attempt; a resume runs them again"
            )
    if rule == "nonzero_std":
        ids, stds = summaries.column("group_id").to_pylist(), summaries.column("std").to_pylist()
        for group_id, std in zip(ids, stds):
            if not std and group_id not in reasons:  # 0.0 or None
                reasons[group_id] = f"nonzero_std: the rewards do not differ (std {std})"
    elif rule is not None:
        name = getattr(rule, "__qualname__", type(rule).__qualname__)
        for group_id, _ in batch:
            if group_id not in reasons and not rule(samples_of(group_id)):
                reasons[group_id] = f"keep_group {name} returned false"
    return reasons
