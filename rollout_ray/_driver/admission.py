"""Admission: when the driver may start the next group, so that staleness is bounded by
admission rather than by discard, and a run that wants a number of groups reads no more tasks.

Counted in groups. A group is *admitted* when its first sample is started and *open* until
it is streamed (handed to the consumer of ``Driver.groups``) or rejected (``keep_rule``); a
group sent back for a stale re-run stays open.

**Staleness** (``max_staleness=k``, ``batch_groups=B``; AReaL's bound on head
off-policyness). The trainer takes ``B`` groups per policy version. Let ``v`` be the
current version, ``s`` the groups streamed since ``v`` became current (at most ``B``
counted: past that the trainer holds its batch and the next group is consumed under
``v + 1`` at the earliest) and ``o`` the open groups. Streamed in turn, the open groups and
one more admitted now are consumed under versions ``v``, ..., ``v + ⌊(s + o) / B⌋``, so the
new group, which starts under ``v``, is consumed within ``k`` versions of it while

    s + o < (k + 1) × B

and admission waits otherwise: a trainer that lags holds rollouts back instead of paying
for them in re-runs. This is AReaL's ``admitted + running ≤ (k + version + 1) × B`` with
the versions and the count taken from the current version rather than from 0, so that a
trainer taking more or fewer than ``B`` groups in one version does not shift every later
bound. Every open group counts as if it will pass the keep rule (no over-sampling: a group
that passed beyond the forecast would arrive too stale); a rejected group frees its place at
once, and the trainer may wait a rollout's time for its replacement. It bounds a count, not
each group: a group consumed after groups admitted after it (it ran longer) may still end
older than ``k``, and the finalize check (``staleness``) is the fallback. When nothing is
open and the consumer waits, one group is admitted whatever the count (a trainer that takes
more than ``B`` groups per version is not left waiting forever; the driver warns once).

**A wanted number of groups** (``max_groups=N``): a group is admitted while the groups
admitted and not rejected are fewer than ``N``; a rejected one makes room for the next
task; the run ends when ``N`` groups were streamed.
"""

from __future__ import annotations

import asyncio
import logging

import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger("rollout_ray")


class Admission:
    """The admission counts of one run, and the wait for room (``room``).

    Args:
        version: the policy version the run starts at.
        max_staleness / batch_groups: the staleness bound (both, or it does not apply).
        max_groups: the groups the run streams, then ends (``None``: every task).
    """

    def __init__(
        self, *, version: int, max_staleness: int | None, batch_groups: int | None, max_groups: int | None
    ) -> None:
        self.window = None if max_staleness is None or batch_groups is None else (max_staleness + 1) * batch_groups
        self.batch_groups, self.max_groups = batch_groups, max_groups
        self.admitted = self.passed = self.rejected = self.streamed = 0
        self.held = 0
        """Groups whose admission waited for the trainer (the staleness bound)."""
        self.before = 0
        """Groups a resumed run streamed before (they count toward ``max_groups``)."""
        self._version, self._streamed_at_version = version, 0
        self._consumer_waits = self._stopped = self._warned = False
        self._changed = asyncio.Event()
        if max_staleness is not None and batch_groups is None:
            log.warning(
                "max_staleness=%d without batch_groups: rollouts are not held back, only checked "
                "when handed on; set batch_groups to the groups your trainer takes per version",
                max_staleness,
            )

    def resumed(self, stored_groups: pa.Table) -> None:
        """A resumed run's stored groups: those not rejected count toward ``max_groups``."""
        rejected = (
            pc.sum(pc.is_valid(stored_groups["rejected"])).as_py() or 0
            if "rejected" in stored_groups.column_names
            else 0
        )
        self.before = stored_groups.num_rows - rejected

    @property
    def open(self) -> int:
        """Groups admitted and neither streamed nor rejected."""
        return self.admitted - self.rejected - self.streamed

    async def room(self) -> bool:
        """Wait until another group may be admitted (``True``), or none will (``False``:
        ``max_groups`` were streamed, or ``stop``)."""
        held = False
        while True:
            if self._stopped or (self.max_groups is not None and self.before + self.passed >= self.max_groups):
                return False
            wanted = self.max_groups is None or self.before + self.admitted - self.rejected < self.max_groups
            fresh = self._within_staleness()
            if wanted and fresh:
                self.held += held
                return True
            held = held or (wanted and not fresh)
            self._changed.clear()
            await self._changed.wait()

    def _within_staleness(self) -> bool:
        if self.window is None:
            return True
        assert self.batch_groups is not None
        taken = min(self.streamed - self._streamed_at_version, self.batch_groups)
        if taken + self.open < self.window:
            return True
        if self.open == 0 and self._consumer_waits:
            if not self._warned:
                self._warned = True
                log.warning(
                    "admission: the consumer took %d groups at policy version %d, more than "
                    "batch_groups=%d, and waits for more: one group at a time is admitted; set "
                    "batch_groups to the groups your trainer takes per version",
                    self.streamed - self._streamed_at_version,
                    self._version,
                    self.batch_groups,
                )
            return True
        return False

    # -- what changes the counts --------------------------------------------------------------

    def admit(self) -> None:
        self.admitted += 1

    def passes(self) -> None:
        """A group passed the keep rule: it is on its way to the consumer."""
        self.passed += 1
        self._changed.set()

    def reject(self) -> None:
        self.rejected += 1
        self._changed.set()

    def stream(self) -> None:
        """The consumer received a group."""
        self.streamed += 1
        self._changed.set()

    def consumer_waits(self, waiting: bool) -> None:
        self._consumer_waits = waiting
        self._changed.set()

    def version(self, version: int) -> None:
        if version > self._version:
            self._version, self._streamed_at_version = version, self.streamed
            self._changed.set()

    def stop(self) -> None:
        """Admit nothing more (the run halted)."""
        self._stopped = True
        self._changed.set()
