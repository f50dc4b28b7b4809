"""A taskset for the command line: a ``.py`` file or a module with ``tasks()`` and ``harness()``."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import sys
from types import ModuleType

from .._core.harness import Harness
from .._core.task import Task
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


def taskset_tasks(module: ModuleType, ref: str, limit: int | None = None) -> list[Task]:
    """The taskset's tasks (the first ``limit``), checked before anything starts.

    Raises:
        TasksetError: ``tasks()`` raised, yielded no task, or yielded something not a ``Task``.
    """
    try:
        produced = module.tasks()
        tasks = list(produced if limit is None else itertools.islice(produced, limit))
    except Exception as e:  # noqa: BLE001 - the user's code: its failure is one line, not a traceback
        raise TasksetError(f"tasks() of {ref} raised {type(e).__name__}: {e}") from None
    if not tasks:
        raise TasksetError(f"tasks() of {ref} yielded no tasks; it must yield Task objects")
    for i, task in enumerate(tasks):
        if not isinstance(task, Task):
            raise TasksetError(f"tasks() of {ref} must yield Task objects (e.g. MyTask({{...}})), "
                               f"but item {i} is a {type(task).__name__}")
    return tasks


def taskset_harness(module: ModuleType, ref: str) -> Harness:
    """The taskset's ``harness()``, checked.

    Raises:
        TasksetError: it raised, or returned something not a ``Harness``.
    """
    try:
        harness = module.harness()
    except Exception as e:  # noqa: BLE001 - the user's code: its failure is one line, not a traceback
        raise TasksetError(f"harness() of {ref} raised {type(e).__name__}: {e}") from None
    if not isinstance(harness, Harness):
        raise TasksetError(f"harness() of {ref} must return a Harness (e.g. ChatHarness()), "
                           f"got a {type(harness).__name__}")
    return harness
