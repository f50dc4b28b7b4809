"""``rollout-ray rescore RUN_DIR [--taskset FILE]``: a run's scoring again, on its stored traces.

No model, sandbox or Ray: the task's ``@metric`` / ``@reward`` / judges on each stored trace,
the taskset's group ``judge`` on each group, in worker processes (``_driver/rescore``). The new
scores are the run's next score version; the earlier ones stay (``_record/score_versions``).
"""

from __future__ import annotations

import argparse
import functools
import os

from .._core.task import Task
from .._errors import CorruptRun, RunInUse, UsageError
from .._record.run_layout import MANIFEST, RunLayout
from .._record.store import read_manifest
from .arguments import integer, number
from .taskset_loader import import_taskset, taskset_tasks


def add_rescore_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by eval")
    p.add_argument(
        "--taskset",
        metavar="FILE",
        help="the taskset with the fixed scoring (default: the one the run "
        "recorded), whose tasks are the run's, in the same order",
    )
    p.add_argument("--workers", metavar="N", type=integer(1), help="worker processes (default: one per CPU)")
    p.add_argument(
        "--timeout",
        metavar="S",
        type=number(above=0),
        help="seconds one rollout's scoring may take (default: the run's scoring timeout, else the task's, else 60)",
    )
    p.set_defaults(run=_rescore)


def taskset_of(ref: str) -> list[Task]:
    """The taskset's tasks (picklable by reference: each worker process imports the taskset)."""
    return taskset_tasks(import_taskset(ref), ref)


def _rescore(args: argparse.Namespace) -> int:
    from .._driver.rescore import RescoreRefused, rescore

    path = args.run_dir
    if not RunLayout.of(path).holds_run():
        raise UsageError(
            f"{path} is not a run directory (no {MANIFEST}); `rollout-ray eval TASKSET --out DIR` writes one"
        )
    try:
        ref = args.taskset or read_manifest(path).config.get("taskset")
    except CorruptRun as e:
        raise UsageError(str(e)) from None
    if not ref:
        raise UsageError(f"{path} records no taskset; give it with --taskset FILE")
    if not args.taskset and (ref.endswith(".py") or os.path.sep in ref) and not os.path.exists(ref):
        raise UsageError(f"the run's taskset {ref} is not here; give it with --taskset FILE")
    module = import_taskset(ref)
    try:
        result = rescore(
            path,
            functools.partial(taskset_of, ref),
            judge=getattr(module, "judge", None),
            workers=args.workers,
            timeout=args.timeout,
            describe=ref,
        )
    except (RescoreRefused, RunInUse, CorruptRun) as e:
        raise UsageError(str(e)) from None
    before, after = _mean(result.mean_before), _mean(result.mean_after)
    print(
        f"rescored {result.rescored} of {result.rows} rollouts ({result.rows - result.rescored} failed before "
        f"scoring) in {result.seconds:.1f}s: {result.changed} rewards changed, {result.failed} scoring failures; "
        f"mean reward {before} -> {after}"
    )
    print(
        f"score version {result.version} written; earlier versions kept "
        f"(read_run({path!r}, scores=1) reads the stored one)"
    )
    return 0


def _mean(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
