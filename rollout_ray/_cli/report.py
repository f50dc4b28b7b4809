"""``rollout-ray report``: the summary and the plot of a run directory."""

from __future__ import annotations

import argparse
import os

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
    from .._driver.run_dir import stored_results

    path = args.run_dir
    if not os.path.isdir(path):
        raise UsageError(f"no such run directory: {path}")
    if not RunLayout.of(path).holds_run() and not shard_paths(path):
        raise UsageError(f"{path} is not a run directory (no {MANIFEST}, no shards); "
                         "`rollout-ray eval TASKSET --out DIR` writes one")
    try:
        samples, groups = stored_results(path)
    except CorruptRun as e:
        raise UsageError(str(e)) from None
    if not samples.num_rows:
        raise UsageError(f"{path} holds no rollouts yet")
    summary = summarize(samples, groups)
    summary["token_rows"] = stored_token_rows(path)
    print(format_summary(summary), flush=True)
    drawn = plot(samples, args.plot or RunLayout.of(path).report_plot) if installed("matplotlib") else NO_PLOT
    print(f"plot: {drawn}")
    return 0
