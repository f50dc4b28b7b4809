"""GroupFinalizer: groups finalized many at once as their last samples close, then stored and streamed.

Groups close one at a time, as their last samples finish. Finalizing each alone would build
a table and run ``finalize`` per group — on the hot path, the largest cost of a rollout in
the driver. The finalizer runs beside the rollouts: it takes every group that closed since it
last looked, builds one table, finalizes it in one call (the statistics are vectorised
across groups), stores the rows, and puts each group on the stream in closing order. Under
load the batches grow by themselves (up to one shard's rows), and finalizes are at least
``GATHER`` seconds apart while groups keep closing; with nothing else to do, a group is handed
on at once.

Closed groups wait in a bounded queue (``capacity``): ``close`` waits for room, so when the
finalizer, its writes or the consumer of the stream fall behind, the rollouts that finish
groups wait, and with them the driver's admission. Memory stays flat however many groups a
run has.

A judge that raises fails the judging of its own group (``judge_error`` on the group's
summary), not the run. A group the keep rule refuses (``keep_rule``) is stored with its
reason (``rejected`` on its summary) and handed to ``rejected`` instead of the stream.

``keep`` (the driver's staleness control) sees each group just before it is finalized,
stored and streamed: a group it sends back (some members were too old for the current
policy version and run again) is closed again later, and ``run`` does not end while one is
out, unless it is ``abandon``-ed; a group it keeps may have members whose tokens are to be
masked from the loss (the samples' ``masked`` column: the reason, or null). With ``keep``, a
group is taken only when the consumer asks for one (a unit of ``demand``): a group finalized
ahead would wait in the stream, growing older, so the check holds at the moment the trainer
receives the group.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .._record.arrow import RolloutRecord, records_to_table
from .bounded_call import JUDGE_TIMEOUT
from .eval_config import KeepGroup
from .finalize import FinalizeConfig, GroupJudge, finalize
from .group import Group
from .keep_rule import rejections
from .run_dir import RunDirectory

log = logging.getLogger("rollout_ray")

WRITE_WITHIN = 2.0
"""Seconds a finalized group waits in memory, at most, before it is written (so a crash of
a slow run loses little); a fast run writes whole shards, ``rows_per_write`` rows at once."""
GATHER = 0.1
"""Seconds between two finalizes, at least, while groups keep closing: a finalize costs ~1-2
ms whatever its size (~60 Arrow columns built, ~20 compute calls), and the groups that close
meanwhile join the next one. A group is handed on this much later at most."""
WRITE_BYTES = 64 << 20
"""Bytes of finalized tables buffered before they are written, at most (large traces)."""


Masks = dict[int, str]
"""Sample index → why its tokens are masked from the loss, for the members of a kept group."""


@dataclass(frozen=True)
class FinalizerStatistics:
    waiting: int
    """Closed groups waiting to be finalized now."""
    most_waiting: int
    """The most that ever waited at once (at most ``capacity``)."""
    capacity: int


class GroupFinalizer:
    """Finalizes the groups closed since it last looked, in one table; stores them and hands
    each to ``emit``.

    Args:
        config / judge: as ``finalize``.
        store: the run directory (``None``: keep the tables in memory, ``tables()``).
        io: the one thread that writes shards (writes stay in order and off the loop).
        emit: awaited with each finalized group that is streamed, in closing order.
        rows_per_write: rows buffered before they are written (or ``write_within`` seconds
            after the first of them was, or ``WRITE_BYTES`` of them: whichever comes first).
        capacity: closed groups waiting to be finalized, at most (``close`` waits for room).
        rule: ``EvalConfig.keep_group``; a group it refuses (or one with a lost member) is
            stored, not emitted, and its id and reason go to ``rejected``.
        keep: asked of each group before it is finalized; ``None`` sends it back (it will
            be closed again), else the masks of its members.
        demand: with ``keep``, released by the consumer once per group it asks for.
        write_within / gather: see ``WRITE_WITHIN`` and ``GATHER`` (``gather`` does not apply
            with ``keep``: a group is finalized when it is asked for).
        judge_timeout: as ``finalize``'s.
    """

    def __init__(
        self,
        *,
        config: FinalizeConfig,
        judge: GroupJudge | None,
        store: RunDirectory | None,
        io: Executor,
        emit: Callable[[Group], Any],
        rows_per_write: int,
        capacity: int = 1 << 30,
        rule: KeepGroup | None = None,
        rejected: Callable[[str, str], None] = lambda *_: None,
        keep: Callable[[str, list[RolloutRecord]], Masks | None] | None = None,
        demand: asyncio.Semaphore | None = None,
        write_within: float = WRITE_WITHIN,
        gather: float = GATHER,
        judge_timeout: float = JUDGE_TIMEOUT,
    ) -> None:
        if (keep is None) != (demand is None):
            raise ValueError("keep and demand go together: pass both or neither")
        self.config, self.judge, self.store, self.io, self.emit = config, judge, store, io, emit
        self.rows_per_write, self.capacity, self.rule, self.rejected = rows_per_write, capacity, rule, rejected
        self.keep, self.demand = keep, demand
        self.write_within, self.gather = write_within, gather
        self.judge_timeout = judge_timeout
        self._finalized_at = -float("inf")  # loop time of the last finalize
        self._out: set[str] = set()
        self._closed: list[tuple[str, list[RolloutRecord]]] = []
        self._most_waiting = 0
        self._masks: dict[str, Masks] = {}
        self._ready, self._room = asyncio.Event(), asyncio.Event()
        self._finished = False
        self._unwritten: list[tuple[pa.Table, pa.Table]] = []
        self._unwritten_rows = self._unwritten_bytes = 0
        self._write_due = 0.0  # loop time by which what is unwritten is written
        self._memory: list[tuple[pa.Table, pa.Table]] = []

    async def close(self, group_id: str, members: list[RolloutRecord]) -> None:
        """A group's last sample finished: finalize it soon. Waits while ``capacity`` groups wait."""
        while len(self._closed) >= self.capacity:
            self._room.clear()
            await self._room.wait()
        self._out.discard(group_id)
        self._closed.append((group_id, sorted(members, key=lambda r: r.sample_idx)))
        self._most_waiting = max(self._most_waiting, len(self._closed))
        self._ready.set()

    def statistics(self) -> FinalizerStatistics:
        return FinalizerStatistics(len(self._closed), self._most_waiting, self.capacity)

    def abandon(self, group_id: str) -> None:
        """A group sent back by ``keep`` will not be closed again (the run halted)."""
        self._out.discard(group_id)
        self._ready.set()

    def finish(self) -> None:
        """No more groups will close: ``run`` ends once it handed on what it has."""
        self._finished = True
        self._ready.set()

    async def run(self) -> None:
        """Until ``finish`` (and no group is out): finalize, store and emit what closed, batch by batch."""
        while True:
            if not self._closed:
                if self._finished and not self._out:
                    return
                self._ready.clear()
                if not self._unwritten:
                    await self._ready.wait()
                    continue
                try:  # idle, with rows unwritten: write them when they are due
                    await asyncio.wait_for(self._ready.wait(), self._write_due - asyncio.get_running_loop().time())
                except TimeoutError:
                    await self.flush()
                continue
            if self.keep is None:
                await self._gathered()
            batch = self._take() if self.keep is None else await self._asked_for()
            self._room.set()
            groups, tables, reasons = self._finalize(batch)
            for samples, summaries in tables:  # stored (or buffered to be) before handed on
                await self._keep(samples, summaries)
            for group in groups:
                if group.group_id in reasons:
                    self.rejected(group.group_id, reasons[group.group_id])
                else:
                    await self.emit(group)
            if self.demand is not None and batch and len(reasons) == len(batch):
                self.demand.release()  # still asked for: the next group answers it

    async def _gathered(self) -> None:
        """Until ``gather`` seconds after the last finalize, unless a write's rows closed or
        the queue is full (groups wait to close)."""
        wait = self._finalized_at + self.gather - asyncio.get_running_loop().time()
        if (
            wait > 0
            and len(self._closed) < self.capacity
            and sum(len(members) for _, members in self._closed) < self.rows_per_write
        ):
            await asyncio.sleep(wait)
        self._finalized_at = asyncio.get_running_loop().time()

    async def _asked_for(self) -> list[tuple[str, list[RolloutRecord]]]:
        """The oldest closed group once the consumer asks for one, if ``keep`` keeps it."""
        assert self.keep is not None and self.demand is not None
        await self.demand.acquire()
        group_id, members = self._closed.pop(0)
        masks = self.keep(group_id, members)
        if masks is not None:
            self._masks[group_id] = masks
            return [(group_id, members)]
        self._out.add(group_id)
        self.demand.release()  # still asked for: the next group answers it
        return []

    def _take(self) -> list[tuple[str, list[RolloutRecord]]]:
        """The oldest closed groups, up to one write's rows (at least one group): a batch is
        one table in memory until it is written, so its size is bounded, not what piled up."""
        rows = taken = 0
        for _, members in self._closed:
            taken += 1
            rows += len(members)
            if rows >= self.rows_per_write:
                break
        batch, self._closed = self._closed[:taken], self._closed[taken:]
        return batch

    async def flush(self) -> None:
        """Write what is buffered (the run ends, or is cancelled: keep what was finalized)."""
        pending, self._unwritten, self._unwritten_rows, self._unwritten_bytes = self._unwritten, [], 0, 0
        if pending and self.store is not None:
            # Shielded: a cancelled flush must still write what it took (it was finalized,
            # and maybe already handed on to the stream).
            await asyncio.shield(asyncio.get_running_loop().run_in_executor(self.io, self._write, pending))

    def tables(self) -> tuple[pa.Table, pa.Table]:
        """Every finalized sample and group summary kept in memory (no run directory)."""
        if not self._memory:
            return pa.table({}), pa.table({})
        samples, groups = zip(*self._memory)
        return (
            pa.concat_tables(samples, promote_options="permissive"),
            pa.concat_tables(groups, promote_options="permissive"),
        )

    async def _keep(self, samples: pa.Table, summaries: pa.Table) -> None:
        if self.store is None:
            self._memory.append((samples, summaries))
            return
        now = asyncio.get_running_loop().time()
        if not self._unwritten:
            self._write_due = now + self.write_within
        self._unwritten.append((samples, summaries))
        self._unwritten_rows += samples.num_rows
        self._unwritten_bytes += samples.nbytes + summaries.nbytes
        if (
            self._unwritten_rows >= self.rows_per_write
            or self._unwritten_bytes >= WRITE_BYTES
            or now >= self._write_due
        ):
            await self.flush()

    def _write(self, pending: list[tuple[pa.Table, pa.Table]]) -> None:
        assert self.store is not None
        samples = pa.concat_tables([s for s, _ in pending], promote_options="permissive")
        summaries = pa.concat_tables([g for _, g in pending], promote_options="permissive")
        self.store.write(samples, summaries)

    # -- finalizing -------------------------------------------------------------------------

    def _finalize(
        self, batch: list[tuple[str, list[RolloutRecord]]]
    ) -> tuple[list[Group], list[tuple[pa.Table, pa.Table]], dict[str, str]]:
        """Every group of ``batch`` finalized, in order; the tables that hold them (the
        batch's two, from one ``finalize`` call, if nothing fails; else one pair per group),
        their summaries with ``rejected``; the reasons of the groups refused."""
        if not batch:
            return [], [], {}
        table = self._table([r for _, members in batch for r in members])
        try:
            result = finalize(table, self.config, self.judge, judge_timeout=self.judge_timeout)
        except Exception:
            if self.judge is None:
                raise
            tables = [self._finalize_alone(group_id, members) for group_id, members in batch]
        else:
            tables = [
                (
                    result.samples,
                    result.groups.append_column("judge_error", pa.nulls(result.groups.num_rows, pa.string())),
                )
            ]
        views: dict[str, Group] = {}

        def samples_of(group_id: str) -> pa.Table:
            if not views:
                views.update((g.group_id, g) for g in self._groups(batch, tables))
            return views[group_id].samples

        summaries = pa.concat_tables([s for _, s in tables]) if len(tables) > 1 else tables[0][1]
        reasons = rejections(batch, summaries, samples_of, self.rule)
        tables = [
            (
                samples,
                summaries.append_column(
                    "rejected",
                    pa.array([reasons.get(g) for g in summaries.column("group_id").to_pylist()], pa.string()),
                ),
            )
            for samples, summaries in tables
        ]
        return self._groups(batch, tables), tables, reasons

    @staticmethod
    def _groups(batch: list[tuple[str, list[RolloutRecord]]], tables: list[tuple[pa.Table, pa.Table]]) -> list[Group]:
        """The groups of ``batch`` as views of ``tables`` (one pair for the batch, or one per group)."""
        if len(tables) > 1:
            return [Group(group_id, samples, summary) for (group_id, _), (samples, summary) in zip(batch, tables)]
        return _split(batch, *tables[0])

    def _table(self, records: list[RolloutRecord]) -> pa.Table:
        """``records`` as a table; with ``keep``, with the ``masked`` column (why a sample's
        tokens are masked from the loss, or null)."""
        table = records_to_table(records)
        if self.keep is None:
            return table
        masked = [self._masks.get(r.group_id, {}).get(r.sample_idx) for r in records]
        for group_id in {r.group_id for r in records}:
            self._masks.pop(group_id, None)
        return table.append_column("masked", pa.array(masked, pa.string()))

    def _finalize_alone(self, group_id: str, members: list[RolloutRecord]) -> tuple[pa.Table, pa.Table]:
        table = self._table(members)
        judge_error = None
        try:
            result = finalize(table, self.config, self.judge, judge_timeout=self.judge_timeout)
        except Exception as e:  # noqa: BLE001 - a judge's failure is its group's
            log.warning("group %s: judge failed: %s: %s", group_id, type(e).__name__, e)
            judge_error = f"{type(e).__name__}: {e}"
            result = finalize(table, self.config)
        return result.samples, result.groups.append_column(
            "judge_error", pa.array([judge_error] * result.groups.num_rows, pa.string())
        )


def _split(batch: list[tuple[str, list[RolloutRecord]]], samples: pa.Table, summaries: pa.Table) -> list[Group]:
    """One ``Group`` per group of ``batch``: a view of its contiguous rows of ``samples`` and
    its summary row (no rows for a group the finalize dropped)."""
    ids = samples.column("group_id").to_numpy(zero_copy_only=False)
    starts = [0, *(np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist(), len(ids)]
    rows = {str(ids[a]): (a, b - a) for a, b in itertools.pairwise(starts) if b > a}
    summary_row = {g: i for i, g in enumerate(summaries.column("group_id").to_pylist())}
    none = summaries.num_rows  # the row past the end: no summary
    return [
        Group(group_id, view=(samples, *rows[group_id], summaries, summary_row[group_id]))
        if group_id in rows
        else Group(group_id, view=(samples, 0, 0, summaries, none))  # dropped
        for group_id, _ in batch
    ]
