"""The sweep's grid file: its schema (pydantic, errors with the key path), its points, and
their run-directory names. ``sweep`` runs them.
"""

from __future__ import annotations

import importlib
import itertools
import re
import tomllib
from dataclasses import dataclass
from types import ModuleType
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .._core.harness import Harness
from .._core.limits import LIMIT_FIELDS
from .._core.sampling import SAMPLING_FIELDS
from .._core.task import Task
from .._errors import UsageError
from .._simulated.config import SimulatedModelConfig
from .taskset_loader import import_taskset

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
            raise ValueError(
                f"simulated-model settings ({', '.join(given)}) given with url; remove "
                "them, or remove url to use the simulated model"
            )
        return self

    def simulated(self) -> SimulatedModelConfig:
        return SimulatedModelConfig(
            **self.model_dump(include=set(_SIMULATED)), model_name=self.model_name or "simulated"
        )

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
    actors: int | None = Field(None, ge=1)
    """Rollout actors (ray executor; default: one per CPU of the cluster)."""
    capacity: int | None = Field(None, ge=1)
    """Rollouts per actor at once (ray executor; none: no cap, ``max_in_flight`` bounds the run)."""


# Keys checked against the names the rest of the package uses, so the two never drift apart.
Sampling = dict[Literal[tuple(sorted(SAMPLING_FIELDS))], Annotated[Any, AfterValidator(_scalar)]]  # type: ignore
Limits = dict[Literal[LIMIT_FIELDS], Annotated[int, Field(strict=True, ge=0)]]  # type: ignore[valid-type]


class SweepGrid(BaseModel):
    """The axes; the sweep runs every combination of one value of each."""

    model_config = _FORBID
    model: list[SweepModel] = Field([SweepModel(name="simulated")], min_length=1)
    """Models (default: the built-in simulated model)."""
    sampling: list[Sampling] = Field([{}], min_length=1)  # type: ignore[valid-type]  # built from the names above
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
        UsageError: the file is missing, not TOML, or names a bad key or value.
    """
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise UsageError.in_file(path, [("", "no such file")]) from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError.in_file(path, [("", f"invalid TOML: {e}")]) from None
    try:
        file = SweepFile.model_validate(raw)
    except ValidationError as e:
        raise UsageError.in_file(path, [_problem(err) for err in e.errors()]) from None
    try:
        module = import_taskset(file.taskset)
    except UsageError as e:
        raise UsageError.in_file(path, [("taskset", str(e))]) from None
    harnesses, problems = {}, []
    for i, ref in enumerate(file.grid.harness):
        try:
            harnesses[ref] = _harness(module, file.taskset, ref)
        except ValueError as e:
            problems.append((f"grid.harness[{i}]", str(e)))
    if problems:
        raise UsageError.in_file(path, problems)
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
        raise ValueError(
            f"{attr!r} is not a function of {where}; name a function returning a Harness, or 'module:function'"
        )
    harness = factory()
    if not isinstance(harness, Harness):
        raise ValueError(f"{ref}() returned {type(harness).__name__}, not a Harness")
    return harness


# -- running ---------------------------------------------------------------------------------
