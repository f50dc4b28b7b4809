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
