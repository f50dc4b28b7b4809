"""``Group``: one finalized group as the trainer receives it from ``Driver.groups()`` — its
samples (with advantages), its one-row summary, and ``batch()``, its padded training arrays."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .batch import agent_batches, batch_arrays

__all__ = ["Group"]


class Group:
    """One finalized group: its samples (with advantages) and its one-row summary.

    The finalizer hands out views of its batch's tables: ``samples`` and ``summary`` are sliced
    on first use (a slice of the ~60-column table costs ~30 us, per group, and a run that
    only stores never asks).
    """

    __slots__ = ("group_id", "_samples", "_summary", "_view")

    def __init__(
        self,
        group_id: str,
        samples: pa.Table | None = None,
        summary: pa.Table | None = None,
        *,
        view: tuple[pa.Table, int, int, pa.Table, int] | None = None,
    ) -> None:
        """``view``: ``(samples, first row, rows, summaries, summary row)`` of a batch."""
        if (samples is None or summary is None) == (view is None):
            raise ValueError("a Group is its samples and summary, or a view of a batch's")
        self.group_id = group_id
        self._samples, self._summary, self._view = samples, summary, view

    @property
    def samples(self) -> pa.Table:
        if self._samples is None:
            table, start, length, _, _ = self._view  # type: ignore[misc]
            self._samples = table.slice(start, length)
        return self._samples

    @property
    def summary(self) -> pa.Table:
        if self._summary is None:
            _, _, _, summaries, row = self._view  # type: ignore[misc]
            self._summary = summaries.slice(row, 1 if row < summaries.num_rows else 0)
        return self._summary

    def __repr__(self) -> str:
        return f"Group({self.group_id!r}, {self.samples.num_rows} samples)"

    def batch(self, pad_to: int | None = None, pad_id: int = 0) -> dict[str, np.ndarray]:
        """The group as padded training arrays: ``input_ids``, ``attention_mask``, ``loss_mask``,
        ``old_logprobs``, ``advantages`` (one row per sequence of each sample; ``_driver/batch.py``).

        Raises:
            ValueError: a sequence is longer than ``pad_to``, or the samples have no token columns.
        """
        return batch_arrays(self.samples, pad_to=pad_to, pad_id=pad_id)

    def batch_by_agent(self, pad_to: int | None = None, pad_id: int = 0) -> dict[str, dict[str, np.ndarray]]:
        """A multi-agent group's batch per agent (agent name → ``batch``'s arrays of that
        agent's sequences, with that agent's own advantages: ``_driver/batch.py``).

        Raises:
            ValueError: as ``batch``, and for samples written before schema version 6.
        """
        return agent_batches(self.samples, pad_to=pad_to, pad_id=pad_id)
