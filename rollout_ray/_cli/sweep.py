"""``rollout-ray sweep``: one eval per point of a grid, and one table comparing the points.

A grid file is TOML::

    taskset = "examples/arith.py"   # a .py path (relative to the current directory) or a module
    [base]                          # shared by every point, all optional
    samples = 2                     # samples per task (default: the taskset's config)
    limit = 10                      # only the first N tasks
    # also: max_in_flight, pass_k = [1, 4], executor = "ray"|"local", actors, capacity, address
    [grid]                          # every axis is a list; the points are their product
    model = [{name = "good"}, {name = "sloppy", error_rate = 0.3},   # no url: the simulated model
             {name = "mine", url = "http://...", model_name = "m", api_key_env = "MY_KEY"}]
    sampling = [{temperature = 0.0}, {temperature = 0.7}]
    limits = [{max_turns = 4}]
    harness = ["harness"]           # a function of the taskset, or "module:function"

Points run in product order, each into ``OUT/<NNN>-model=<name>-<key>=<value>...`` (every
sampling and limit key; the harness if the grid sets it), all on one executor: Ray starts
once per sweep. ``OUT/comparison.{parquet,csv,png}`` compare them. ``--resume`` skips complete
points and resumes the others; a point stored with other settings is an error, never a mix.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq

from .._driver.driver import EvalConfig, RunResult, group_id_of
from .._driver.run_dir import changed_settings as _changed
from .._driver.run_dir import stored_results
from .._errors import CorruptRun, RunInUse, UsageError
from .._hosting.executor import Executor
from .._record.run_files import RunFiles
from .._record.run_layout import RunLayout
from .._record.store import done_keys, read_manifest
from .comparison import comparison_row, comparison_table, format_comparison, plot_comparison
from .drive import drive, eval_config, make_executor, open_model
from .extras import NO_PLOT, installed
from .grid import (
    Point,
    Sweep,
    SweepBase,
    load_sweep,
)
from .interrupt import Signals
from .protections import with_finite_defaults
from .runs import continue_command
from .warmup import warm_up

GRID_COPY = "grid.toml"


def add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    p.description, p.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    p.add_argument("grid", help="a TOML grid file (see above and examples/sweep.toml)")
    p.add_argument(
        "--out", help="directory for the points' run dirs and the comparison (default: runs/sweep-<grid file name>)"
    )
    p.add_argument("--resume", action="store_true", help="skip complete points, resume incomplete ones")
    p.add_argument("--executor", choices=["ray", "local"], help="override [base] executor")
    p.add_argument("--address", help="override [base] address (Ray cluster)")
    p.set_defaults(run=_sweep)


def _sweep(args: argparse.Namespace) -> int:
    try:
        sweep = load_sweep(args.grid)
        overrides = {"executor": args.executor, "address": args.address}
        base = sweep.file.base.model_copy(update={k: v for k, v in overrides.items() if v})
        out = args.out or os.path.join("runs", "sweep-" + os.path.splitext(os.path.basename(args.grid))[0])
        plan = preflight(sweep, out, resume=args.resume)
        _copy_grid(args.grid, out)
    except (UsageError, CorruptRun) as e:  # CorruptRun: a link where a point or the sweep's file is
        print("\n".join(f"rollout-ray sweep: {line}" for line in str(e).splitlines()), file=sys.stderr)
        return 2
    signals = Signals()
    try:
        table = asyncio.run(_run_until_signalled(sweep, out, plan, base, signals))
    except (CorruptRun, RunInUse) as e:  # a link planted in a point or the sweep's folder, a point in use
        print(f"rollout-ray sweep: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the event loop took the signal over
        return _interrupted(args, sweep, out, signal.SIGINT)
    if table is None:
        assert signals.received is not None
        return _interrupted(args, sweep, out, signals.received)
    print(format_comparison(table))
    drawn = f"{out}/comparison.png" if installed("matplotlib") else NO_PLOT
    print(f"comparison: {out}/comparison.parquet, {out}/comparison.csv, plot: {drawn}")
    return 3 if "halted" in table["status"].to_pylist() else 0


async def _run_until_signalled(
    sweep: Sweep, out: str, plan: dict[str, str], base: SweepBase, signals: Signals
) -> pa.Table | None:
    """``run_sweep``, or ``None`` once SIGINT or SIGTERM stopped it (what is stored stays)."""
    signals.install()  # also when SIGINT was ignored at start (a background job): kill -INT stops it
    try:
        return await run_sweep(sweep, out, plan, base, signals=signals)
    except asyncio.CancelledError:
        if signals.received is None:
            raise
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
        return None


def _interrupted(args: argparse.Namespace, sweep: Sweep, out: str, signum: int) -> int:
    try:
        stored = sum(_complete(sweep, point, os.path.join(out, point.name)) for point in sweep.points)
    except Exception:  # noqa: BLE001 - the count is a courtesy; the line must still be printed
        stored = 0
    print(
        f"\ninterrupted: {stored} of {len(sweep.points)} points stored; continue with: "
        f"{continue_command(args.argv, out)}",
        file=sys.stderr,
    )
    return 128 + signum


def _complete(sweep: Sweep, point: Point, run_dir: str) -> bool:
    """Whether every rollout of ``point`` is stored in ``run_dir``."""
    if not RunLayout.of(run_dir).holds_run():
        return False
    samples = point_config(sweep, point).samples_per_task
    return {(group_id_of(i, t), s) for i, t in enumerate(sweep.tasks) for s in range(samples)} <= done_keys(run_dir)


def point_config(sweep: Sweep, point: Point) -> EvalConfig:
    base = sweep.file.base
    config = eval_config(
        sweep.module,
        samples=base.samples,
        max_in_flight=base.max_in_flight,
        model_name=point.model.upstream(),
        limits=point.limits,
        sampling=point.sampling,
        finalize={"pass_k": sorted(base.pass_k)} if base.pass_k else None,
    )
    return with_finite_defaults(config)[0]  # as eval's: no point runs an endless agent forever


def _record(sweep: Sweep, point: Point) -> dict[str, Any]:
    """What the point's manifest records of it; a resume must find the same."""
    fields = {
        "model": point.model.model_dump(mode="json"),
        "sampling": point.sampling,
        "limits": point.limits,
        "harness": point.harness,
        "limit": sweep.file.base.limit,
    }
    return json.loads(json.dumps(fields))  # type: ignore[no-any-return]


def preflight(sweep: Sweep, out: str, *, resume: bool) -> dict[str, str]:
    """Each point's action, ``run``, ``resume`` or ``skip``, decided before anything runs.

    Raises:
        UsageError: ``out`` holds runs and ``resume`` is off, or a stored point's
            settings differ from the grid's.
    """
    plan, problems = {}, []
    for point in sweep.points:
        run_dir = os.path.join(out, point.name)
        if not RunLayout.of(run_dir).holds_run():
            plan[point.name] = "run"
            continue
        if not resume:
            raise UsageError.in_file(
                out,
                [
                    (
                        "",
                        f"already holds runs of a sweep ({point.name}, ...); "
                        "pass --resume to continue it, or choose another --out",
                    )
                ],
            )
        config = point_config(sweep, point)
        stored = read_manifest(run_dir).config
        now = {"sweep": _record(sweep, point), "eval": config.model_dump(mode="json")}
        changed = _changed({k: stored.get(k) for k in now}, now)
        if changed:
            problems.append(
                (
                    point.name,
                    f"was run with other settings ({', '.join(changed)}); resume "
                    "with the grid it was run with, or choose another --out",
                )
            )
        plan[point.name] = "skip" if _complete(sweep, point, run_dir) else "resume"
    if problems:
        raise UsageError.in_file(out, problems)
    os.makedirs(out, exist_ok=True)
    return plan


async def run_sweep(
    sweep: Sweep, out: str, plan: dict[str, str], base: SweepBase, *, signals: Signals | None = None
) -> pa.Table:
    """Run (or skip, or resume) every point on one executor; write and return the comparison.
    ``signals`` are installed again once Ray started (``ray.init`` sets its own handlers)."""
    rows = []
    async with AsyncExitStack() as stack:
        executor: Executor | None = None
        for point in sweep.points:
            label = f"[{point.index}/{len(sweep.points)}] {point.name}"
            config = point_config(sweep, point)
            run_dir = os.path.join(out, point.name)
            if plan[point.name] == "skip":
                samples, groups = stored_results(run_dir, config.finalize, getattr(sweep.module, "judge", None))
                # The run's status is not stored, only its rollouts: all of them, here.
                status, reason = "stored", ""
            else:
                if executor is None:  # once per sweep, and not at all when every point is done
                    started = time.monotonic()
                    executor = await stack.enter_async_context(
                        make_executor(
                            base.executor,
                            sweep.module,
                            actors=base.actors,
                            capacity=base.capacity,
                            address=base.address,
                        )
                    )
                    if signals is not None:
                        signals.install()
                    # Before the first point: its setup spans are not charged with the cold start.
                    what = await warm_up(executor)
                    if what is not None:
                        print(f"warmup {time.monotonic() - started:.1f}s: Ray, {what}", file=sys.stderr)
                result = await _run_point(
                    sweep, point, config, executor, run_dir, label, resume=plan[point.name] == "resume"
                )
                samples, groups, status, reason = result.samples, result.groups, result.status, result.reason
            row = comparison_row(point, samples, groups, status, reason, run_dir)
            done = {"stored": "skipped (complete)", "halted": f"halted ({reason})"}.get(status, status)
            print(
                f"{label}: {done}, mean reward {row['mean_reward']:.4f}, failed {row['failed']}/{row['rollouts']}",
                file=sys.stderr,
            )
            rows.append(row)
    table = comparison_table(rows)
    # Written as a run directory's files are (``run_files``): a sweep's directory may be shared
    # as a run's is, and a link planted under one of these names is refused, never written through.
    with RunFiles.open(out, create=True) as folder:
        with folder.replacing("comparison.parquet") as f:
            pq.write_table(table, f)
        with folder.replacing("comparison.csv") as f:
            pyarrow.csv.write_csv(table, f)
        if installed("matplotlib"):
            with folder.replacing("comparison.png") as f:
                plot_comparison(table, f)
    return table


def _copy_grid(grid: str, out: str) -> None:
    """Keep the grid file in ``out`` (``grid.toml``), unless the sweep was resumed from that copy.

    Raises:
        CorruptRun: ``out`` or its ``grid.toml`` is a link (never written through).
    """
    with RunFiles.open(out, create=True) as folder:
        if folder.exists(GRID_COPY) and os.path.samestat(os.stat(grid), folder.stat(GRID_COPY)):
            return
        with open(grid, "rb") as f:
            folder.write_bytes(GRID_COPY, f.read())


async def _run_point(
    sweep: Sweep, point: Point, config: EvalConfig, executor: Executor, run_dir: str, label: str, *, resume: bool
) -> RunResult:
    async with AsyncExitStack() as stack:
        model, where, record = await open_model(
            stack,
            url=point.model.url,
            name=point.model.upstream(),
            api_key_env=point.model.api_key_env,
            simulated=point.model.simulated(),
        )
        manifest = {"taskset": sweep.file.taskset, "model": record, "sweep": _record(sweep, point)}
        return await drive(
            label,
            sweep.module,
            sweep.tasks,
            sweep.harnesses[point.harness],
            model,
            executor,
            config,
            run_dir,
            resume=resume,
            where=where,
            manifest_config=manifest,
        )


# -- the comparison --------------------------------------------------------------------------
