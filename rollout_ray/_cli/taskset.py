"""A taskset for the command line: a ``.py`` file or a module with ``tasks()`` and ``harness()``."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

from .._errors import TasksetError


def import_taskset(ref: str) -> ModuleType:
    """Import a taskset from a file path or a module name.

    Raises:
        TasksetError: no such file, or ``tasks`` / ``harness`` is not a function of it.
    """
    if ref.endswith(".py") or os.path.sep in ref:
        if not os.path.exists(ref):
            raise TasksetError(f"no such file: {ref}")
        name = "taskset_" + os.path.splitext(os.path.basename(ref))[0]
        spec = importlib.util.spec_from_file_location(name, ref)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(ref)
    for needed in ("tasks", "harness"):
        if not callable(getattr(module, needed, None)):
            raise TasksetError(f"{ref} must define {needed}() (see `rollout-ray eval --help`)")
    return module


def load_taskset(ref: str) -> ModuleType:
    """``import_taskset`` for the command line: a bad reference exits with its message."""
    try:
        return import_taskset(ref)
    except TasksetError as e:
        raise SystemExit(f"rollout-ray eval: {e}") from None


def taskset_modules(module: ModuleType) -> list[ModuleType]:
    """The taskset and the plain modules beside it that it imported (``from calc_tool import
    ...`` in ``examples/program.py``): workers can import none of them, so all go by value."""
    path = getattr(module, "__file__", None)
    if path is None or not module.__name__.startswith("taskset_"):  # see load_taskset
        return [module]  # given as a module name: what it imports, workers import too
    folder = os.path.dirname(os.path.abspath(path))
    beside = [m for m in list(sys.modules.values())
              if m is not module and getattr(m, "__file__", None)
              and os.path.dirname(os.path.abspath(m.__file__)) == folder  # type: ignore[arg-type]
              and not m.__file__.endswith("__init__.py")]  # type: ignore[union-attr]
    return [module, *beside]
