"""``rollout-ray report``: the summary and the plot of a run directory."""

from __future__ import annotations

import argparse
import os

import pyarrow as pa

from .._errors import CorruptRun, UsageError
from .._record.run_layout import MANIFEST, REPORT_PLOT, RunLayout
from .._record.store import shard_paths
from .extras import NO_PLOT, installed
from .summary import format_summary, plot, stored_token_rows, summarize


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run directory written by eval")
    p.add_argument("--plot", help=f"PNG path (default: RUN_DIR/{REPORT_PLOT})")
    p.set_defaults(run=_report)


def _report(args: argparse.Namespace) -> int:
    path = args.run_dir
    if not os.path.isdir(path):
        raise UsageError(f"no such run directory: {path}")
    try:
        return _summarize(path, args.plot)
    except CorruptRun as e:  # a damaged run, or a link where a run's file is
        raise UsageError(str(e)) from None


def _summarize(path: str, plot_path: str | None) -> int:
    from .._driver.run_dir import stored_results

    if not RunLayout.of(path).holds_run() and not shard_paths(path):
        raise UsageError(
            f"{path} is not a run directory (no {MANIFEST}, no shards); `rollout-ray eval TASKSET --out DIR` writes one"
        )
    samples, groups = stored_results(path)
    if not samples.num_rows:
        raise UsageError(f"{path} holds no rollouts yet")
    summary = summarize(samples, groups)
    summary["token_rows"] = stored_token_rows(path)
    print(format_summary(summary), flush=True)
    drawn = _plot(samples, path, plot_path) if installed("matplotlib") else NO_PLOT
    print(f"plot: {drawn}")
    return 0


def _plot(samples: pa.Table, run_dir: str, path: str | None) -> str:
    """Draw the plot to ``path`` (the caller's choice), else into the run directory, as its
    files are written (``run_files``: through no link)."""
    if path is not None:
        return plot(samples, path)  # type: ignore[no-any-return]
    layout = RunLayout.of(run_dir)
    with layout.open() as run, run.replacing(REPORT_PLOT) as f:
        plot(samples, f)
    return str(layout.report_plot)
