"""``rollout-ray report``: the summary and the plot of a run directory."""

from __future__ import annotations

import argparse
import os

from .._driver.run_dir import stored_results
from .summary import format_summary, plot, summarize


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run directory written by eval")
    p.add_argument("--plot", help="PNG path (default: RUN_DIR/report.png)")
    p.set_defaults(run=_report)


def _report(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.run_dir):
        raise SystemExit(f"rollout-ray report: no such run directory: {args.run_dir}")
    samples, groups = stored_results(args.run_dir)
    if not samples.num_rows:
        raise SystemExit(f"rollout-ray report: {args.run_dir} holds no rollouts yet")
    print(format_summary(summarize(samples, groups)))
    print(f"plot: {plot(samples, args.plot or os.path.join(args.run_dir, 'report.png'))}")
    return 0
