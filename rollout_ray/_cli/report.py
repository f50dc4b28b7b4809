"""``rollout-ray report``: the summary and the plot of a run directory."""

from __future__ import annotations

import argparse
import os

from .._driver.finalize import FinalizeConfig, finalize
from .._record.store import read_manifest, read_run
from .summary import format_summary, plot, summarize


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run directory written by eval")
    p.add_argument("--plot", help="PNG path (default: RUN_DIR/report.png)")
    p.set_defaults(run=_report)


def _report(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.run_dir):
        raise SystemExit(f"rollout-ray report: no such run directory: {args.run_dir}")
    stored = read_run(args.run_dir)
    if not stored.num_rows:
        raise SystemExit(f"rollout-ray report: {args.run_dir} holds no rollouts yet")
    recorded = read_manifest(args.run_dir).config.get("eval", {}).get("finalize")
    whole = finalize(stored, FinalizeConfig.model_validate(recorded) if recorded else FinalizeConfig())
    print(format_summary(summarize(whole.samples, whole.groups)))
    print(f"plot: {plot(whole.samples, args.plot or os.path.join(args.run_dir, 'report.png'))}")
    return 0
