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
import importlib
import itertools
import json
import os
import re
import shutil
import sys
import tomllib
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import ModuleType
from typing import Annotated, Any, Literal

import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ._driver import EvalConfig, RunResult, group_id_of
from ._eval_command import (
    TasksetError,
    drive,
    eval_config,
    import_taskset,
    make_executor,
    open_model,
)
from ._executor import Executor
from ._finalize import finalize
from ._harness import Harness
from ._limits import LIMIT_FIELDS
from ._session import SAMPLING_FIELDS
from ._simulated_model import SimulatedModelConfig
from ._store import done_keys, read_manifest, read_run
from ._comparison import comparison_row, comparison_table, format_comparison, plot_comparison
from ._task import Task

_SIMULATED = frozenset(SimulatedModelConfig.model_fields) - {"model_name"}
_FORBID = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


def _scalar(value: Any) -> Any:
    if not isinstance(value, str | int | float | bool):
        raise ValueError(f"must be a number, a string or a boolean, got {type(value).__name__}")
    return value


class SweepModel(SimulatedModelConfig):
    """One model of the grid: an OpenAI-compatible ``url``, or (without one) the built-in
    simulated model with the simulated settings given here (``error_rate``, ``ttft``, ...)."""

    name: str = Field(min_length=1)
    """The model's label in run directory names and the comparison table; unique in the grid."""
    url: str | None = None
    """OpenAI-compatible base URL; none means the built-in simulated model."""
    model_name: str | None = None  # type: ignore[assignment]
    """With a url: the model name sent upstream (default: ``name``). Simulated: the name served."""
    api_key_env: str = "OPENAI_API_KEY"
    """With a url: the environment variable holding the provider's key."""

    @model_validator(mode="after")
    def _simulated_only_without_url(self) -> SweepModel:
        given = sorted(self.model_fields_set & _SIMULATED)
        if self.url is not None and given:
            raise ValueError(f"simulated-model settings ({', '.join(given)}) given with url; remove "
                             "them, or remove url to use the simulated model")
        return self

    def simulated(self) -> SimulatedModelConfig:
        return SimulatedModelConfig(**self.model_dump(include=set(_SIMULATED)),
                                    model_name=self.model_name or "simulated")

    def upstream(self) -> str | None:
        """The model name forced on every request: a url model's own, none for the simulated."""
        return (self.model_name or self.name) if self.url else None


class SweepBase(BaseModel):
    """Eval settings shared by every point; unset ones come from the taskset's ``config``."""

    model_config = _FORBID
    samples: int | None = Field(None, ge=1)
    """Samples per task (n)."""
    limit: int | None = Field(None, ge=1)
    """Run only the first N tasks."""
    max_in_flight: int | None = Field(None, ge=1)
    """Rollouts running at once."""
    pass_k: set[Annotated[int, Field(ge=1)]] | None = None
    """The k of the pass@k columns (default: the taskset's finalize config)."""
    executor: Literal["ray", "local"] = "ray"
    """ray: rollout actors, Ray started once for the sweep; local: this process, no Ray."""
    address: str | None = None
    """Ray cluster address (default: start or join a local Ray)."""
    actors: int = Field(2, ge=1)
    """Rollout actors (ray executor)."""
    capacity: int = Field(64, ge=1)
    """Rollouts per actor at once (ray executor)."""


# Keys checked against the names the rest of the package uses, so the two never drift apart.
Sampling = dict[Literal[tuple(sorted(SAMPLING_FIELDS))], Annotated[Any, AfterValidator(_scalar)]]  # type: ignore
Limits = dict[Literal[LIMIT_FIELDS], Annotated[int, Field(strict=True, ge=0)]]  # type: ignore[valid-type]


class SweepGrid(BaseModel):
    """The axes; the sweep runs every combination of one value of each."""

    model_config = _FORBID
    model: list[SweepModel] = Field([SweepModel(name="simulated")], min_length=1)
    """Models (default: the built-in simulated model)."""
    sampling: list[Sampling] = Field([{}], min_length=1)
    """Sampling settings sent with every request, e.g. ``{temperature = 0.7}``."""
    limits: list[Limits] = Field([{}], min_length=1)
    """Rollout limits over the taskset's, e.g. ``{max_turns = 4}``."""
    harness: list[str] = Field(["harness"], min_length=1)
    """Harness factories: a function of the taskset module, or ``"module:function"``."""

    @field_validator("model")
    @classmethod
    def _unique_names(cls, models: list[SweepModel]) -> list[SweepModel]:
        names = [m.name for m in models]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"model names must be unique; repeated: {', '.join(twice)}")
        return models


class SweepFile(BaseModel):
    """A whole grid file."""

    model_config = _FORBID
    taskset: str
    """A ``.py`` file (relative to the current directory) or a module, as for ``eval``."""
    base: SweepBase = SweepBase()
    grid: SweepGrid = SweepGrid()


class SweepConfigError(ValueError):
    """A grid file that cannot be run; ``problems`` are ``(key path, message)`` pairs."""

    def __init__(self, path: str, problems: list[tuple[str, str]]) -> None:
        super().__init__("\n".join(f"{path}: {where}: {what}" if where else f"{path}: {what}"
                                   for where, what in problems))
        self.path, self.problems = path, problems


@dataclass(frozen=True)
class Point:
    """One combination of the grid's axes, with its run directory name."""

    index: int
    name: str
    model: SweepModel
    sampling: dict[str, Any]
    limits: dict[str, int]
    harness: str

    def settings(self) -> dict[str, Any]:
        return {"model": self.model.name, **self.sampling, **self.limits, "harness": self.harness}


@dataclass(frozen=True)
class Sweep:
    """A validated grid file, its taskset loaded and its harnesses built."""

    file: SweepFile
    module: ModuleType
    tasks: list[Task]
    harnesses: dict[str, Harness]
    points: list[Point]


def expand(grid: SweepGrid) -> list[Point]:
    """Every point of ``grid`` in product order, named ``NNN-key=value-...``."""
    combos = list(itertools.product(grid.model, grid.sampling, grid.limits, grid.harness))
    width = max(3, len(str(len(combos))))
    points = []
    for index, (model, sampling, limits, harness) in enumerate(combos, 1):
        label: dict[str, Any] = {"model": model.name, **sampling, **limits}
        if "harness" in grid.model_fields_set:
            label["harness"] = harness
        name = "-".join([f"{index:0{width}d}", *(f"{k}={_slug(v)}" for k, v in label.items())])
        points.append(Point(index, name, model, dict(sampling), dict(limits), harness))
    return points


def _slug(value: Any) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text)


def load_sweep(path: str) -> Sweep:
    """Parse and validate a grid file, import its taskset and build its harnesses.

    Raises:
        SweepConfigError: the file is missing, not TOML, or names a bad key or value.
    """
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise SweepConfigError(path, [("", "no such file")]) from None
    except tomllib.TOMLDecodeError as e:
        raise SweepConfigError(path, [("", f"invalid TOML: {e}")]) from None
    try:
        file = SweepFile.model_validate(raw)
    except ValidationError as e:
        raise SweepConfigError(path, [_problem(err) for err in e.errors()]) from None
    try:
        module = import_taskset(file.taskset)
    except TasksetError as e:
        raise SweepConfigError(path, [("taskset", str(e))]) from None
    harnesses, problems = {}, []
    for i, ref in enumerate(file.grid.harness):
        try:
            harnesses[ref] = _harness(module, file.taskset, ref)
        except ValueError as e:
            problems.append((f"grid.harness[{i}]", str(e)))
    if problems:
        raise SweepConfigError(path, problems)
    tasks = list(module.tasks())[: file.base.limit]
    return Sweep(file, module, tasks, harnesses, expand(file.grid))


def _problem(err: Any) -> tuple[str, str]:
    loc = [p for p in err["loc"] if p != "[key]"]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    if err["type"] == "extra_forbidden":
        return where, "unknown key"
    if "[key]" in err["loc"]:
        return where, f"unknown key; expected {err['ctx']['expected']}"
    return where, err["msg"].removeprefix("Value error, ")


def _harness(module: ModuleType, taskset: str, ref: str) -> Harness:
    owner, _, attr = ref.rpartition(":")
    try:
        factory = getattr(importlib.import_module(owner) if owner else module, attr, None)
    except ImportError as e:
        raise ValueError(f"cannot import {owner}: {e}") from None
    if not callable(factory):
        where = owner or taskset
        raise ValueError(f"{attr!r} is not a function of {where}; name a function returning a Harness, "
                         "or 'module:function'")
    harness = factory()
    if not isinstance(harness, Harness):
        raise ValueError(f"{ref}() returned {type(harness).__name__}, not a Harness")
    return harness


# -- running ---------------------------------------------------------------------------------


def add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    p.description, p.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    p.add_argument("grid", help="a TOML grid file (see above and examples/sweep.toml)")
    p.add_argument("--out", help="directory for the points' run dirs and the comparison "
                                 "(default: runs/sweep-<grid file name>)")
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
    except SweepConfigError as e:
        print("\n".join(f"rollout-ray sweep: {line}" for line in str(e).splitlines()), file=sys.stderr)
        return 2
    copy = os.path.join(out, "grid.toml")
    if not (os.path.exists(copy) and os.path.samefile(args.grid, copy)):  # resumed from its own copy
        shutil.copyfile(args.grid, copy)
    table = asyncio.run(run_sweep(sweep, out, plan, base))
    print(format_comparison(table))
    print(f"comparison: {out}/comparison.parquet, {out}/comparison.csv, plot: {out}/comparison.png")
    return 3 if "halted" in table["status"].to_pylist() else 0


def point_config(sweep: Sweep, point: Point) -> EvalConfig:
    base = sweep.file.base
    return eval_config(sweep.module, samples=base.samples, max_in_flight=base.max_in_flight,
                       model_name=point.model.upstream(), limits=point.limits, sampling=point.sampling,
                       finalize={"pass_k": sorted(base.pass_k)} if base.pass_k else None)


def _record(sweep: Sweep, point: Point) -> dict[str, Any]:
    """What the point's manifest records of it; a resume must find the same."""
    fields = {"model": point.model.model_dump(mode="json"), "sampling": point.sampling,
              "limits": point.limits, "harness": point.harness, "limit": sweep.file.base.limit}
    return json.loads(json.dumps(fields))


def preflight(sweep: Sweep, out: str, *, resume: bool) -> dict[str, str]:
    """Each point's action, ``run``, ``resume`` or ``skip``, decided before anything runs.

    Raises:
        SweepConfigError: ``out`` holds runs and ``resume`` is off, or a stored point's
            settings differ from the grid's.
    """
    plan, problems = {}, []
    for point in sweep.points:
        run_dir = os.path.join(out, point.name)
        if not os.path.exists(os.path.join(run_dir, "manifest.json")):
            plan[point.name] = "run"
            continue
        if not resume:
            raise SweepConfigError(out, [("", f"already holds runs of a sweep ({point.name}, ...); "
                                              "pass --resume to continue it, or choose another --out")])
        config = point_config(sweep, point)
        stored = read_manifest(run_dir).config
        now = {"sweep": _record(sweep, point), "eval": config.model_dump(mode="json")}
        changed = _changed({k: stored.get(k) for k in now}, now)
        if changed:
            problems.append((point.name, f"was run with other settings ({', '.join(changed)}); resume "
                                         "with the grid it was run with, or choose another --out"))
        planned = {(group_id_of(t), s) for t in sweep.tasks for s in range(config.samples_per_task)}
        plan[point.name] = "skip" if planned <= done_keys(run_dir) else "resume"
    if problems:
        raise SweepConfigError(out, problems)
    os.makedirs(out, exist_ok=True)
    return plan


def _changed(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [c for k in sorted(old.keys() | new.keys(), key=str)
                for c in _changed(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [prefix.rstrip(".")]


async def run_sweep(sweep: Sweep, out: str, plan: dict[str, str], base: SweepBase) -> pa.Table:
    """Run (or skip, or resume) every point on one executor; write and return the comparison."""
    rows = []
    async with AsyncExitStack() as stack:
        executor: Executor | None = None
        for point in sweep.points:
            label = f"[{point.index}/{len(sweep.points)}] {point.name}"
            config = point_config(sweep, point)
            run_dir = os.path.join(out, point.name)
            if plan[point.name] == "skip":
                whole = finalize(read_run(run_dir), config.finalize, getattr(sweep.module, "judge", None))
                # The run's status is not stored, only its rollouts: all of them, here.
                samples, groups, status, reason = whole.samples, whole.groups, "stored", ""
            else:
                if executor is None:  # once per sweep, and not at all when every point is done
                    executor = await stack.enter_async_context(make_executor(
                        base.executor, sweep.module, actors=base.actors, capacity=base.capacity,
                        address=base.address))
                result = await _run_point(sweep, point, config, executor, run_dir, label,
                                          resume=plan[point.name] == "resume")
                samples, groups, status, reason = result.samples, result.groups, result.status, result.reason
            row = comparison_row(point, samples, groups, status, reason, run_dir)
            done = {"stored": "skipped (complete)", "halted": f"halted ({reason})"}.get(status, status)
            print(f"{label}: {done}, mean reward {row['mean_reward']:.4f}, "
                  f"failed {row['failed']}/{row['rollouts']}", file=sys.stderr)
            rows.append(row)
    table = comparison_table(rows)
    pq.write_table(table, os.path.join(out, "comparison.parquet"))
    pyarrow.csv.write_csv(table, os.path.join(out, "comparison.csv"))
    plot_comparison(table, os.path.join(out, "comparison.png"))
    return table


async def _run_point(sweep: Sweep, point: Point, config: EvalConfig, executor: Executor, run_dir: str,
                     label: str, *, resume: bool) -> RunResult:
    async with AsyncExitStack() as stack:
        model, where = await open_model(stack, url=point.model.url, name=point.model.upstream(),
                                        api_key_env=point.model.api_key_env,
                                        simulated=point.model.simulated())
        manifest = {"taskset": sweep.file.taskset, "model": where, "sweep": _record(sweep, point)}
        return await drive(label, sweep.module, sweep.tasks, sweep.harnesses[point.harness], model,
                           executor, config, run_dir, resume=resume, manifest_config=manifest)


# -- the comparison --------------------------------------------------------------------------
