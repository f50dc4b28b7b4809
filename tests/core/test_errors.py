"""Every error of the error model survives a trip between processes (Ray pickles them)."""

from __future__ import annotations

import inspect
import pickle
from pathlib import Path

import pytest

from rollout_ray import _errors

ERRORS = sorted(
    (
        v
        for v in vars(_errors).values()
        if isinstance(v, type) and issubclass(v, BaseException) and v.__module__ == _errors.__name__
    ),
    key=lambda cls: cls.__name__,
)
SAMPLES = {
    "path": Path("/runs/x/shard.parquet"),
    "status_code": 503,
    "settings": ["model"],
    "problems": [("grid.model", "unknown")],
}


def _instance(cls: type[BaseException]) -> BaseException:
    params = [
        p
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self" and p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    kwargs = {p.name: SAMPLES.get(p.name, f"<{p.name}>") for p in params}
    positional = [kwargs.pop(p.name) for p in params if p.kind is not p.KEYWORD_ONLY]
    return cls(*positional, **kwargs)


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_an_error_pickles_to_an_equal_error(cls: type[BaseException]) -> None:
    error = _instance(cls)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls and copy.args == error.args and str(copy) == str(error)
    assert vars(copy) == vars(error)


def test_a_subclass_defined_elsewhere_pickles_too() -> None:
    error = Custom("disk full", where="/tmp")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.where) == (Custom, "sandbox failed: disk full", "/tmp")


class Custom(_errors.SandboxError):
    def __init__(self, message: str, *, where: str) -> None:
        super().__init__(f"sandbox failed: {message}")
        self.where = where
