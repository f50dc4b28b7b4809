"""A taskset for the command line: a ``.py`` file or a module with ``tasks()`` and ``harness()``."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import site
import sys
import traceback
from types import ModuleType

from pydantic import ValidationError

from .._core.harness import Harness
from .._core.task import Task
from .._errors import UsageError
from .arguments import one_line


def import_taskset(ref: str) -> ModuleType:
    """Import a taskset from a file path or a module name.

    Raises:
        UsageError: no such file, importing it raised (the message names the user's line),
            or ``tasks`` / ``harness`` is not a function of it.
    """
    if (ref.endswith(".py") or os.path.sep in ref) and not os.path.exists(ref):
        raise UsageError(f"no such file: {ref}")
    try:
        module = _import(ref)
    except Exception as e:  # noqa: BLE001 - the user's code: its failure is one line, not a traceback
        raise UsageError(f"importing {ref} raised {import_failure(e)}") from None
    for needed in ("tasks", "harness"):
        if not callable(getattr(module, needed, None)):
            raise UsageError(f"{ref} must define {needed}() (see `rollout-ray eval --help`)")
    return module


def import_v1_taskset(ref: str, limit: int | None = None) -> ModuleType:
    """A verifiers v1 taskset as a taskset of ours (``rollout_ray._verifiers``).

    Raises:
        UsageError: verifiers is not installed, loading ``ref`` raised, or it asks for what is
            not mapped yet (one line naming it).
    """
    from .._verifiers import v1_taskset

    try:
        return v1_taskset(ref, limit)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "verifiers":
            raise UsageError(f"importing {ref} raised {import_failure(e)}") from None
        raise UsageError("--verifiers needs verifiers v1: pip install 'rollout_ray[verifiers]'") from None
    except ValueError as e:
        raise UsageError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - the user's code: its failure is one line, not a traceback
        raise UsageError(f"loading verifiers taskset {ref} raised {import_failure(e)}") from None


def _import(ref: str) -> ModuleType:
    if not (ref.endswith(".py") or os.path.sep in ref):
        return importlib.import_module(ref)
    name = "taskset_" + os.path.splitext(os.path.basename(ref))[0]
    spec = importlib.util.spec_from_file_location(name, ref)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def import_failure(error: BaseException) -> str:
    """``error`` as one line that points at the user's code: ``NameError: name 'x' is not
    defined (at tasks.py:3: y = x)``. The line is a syntax error's own, or the last of the
    traceback that is neither importlib's, this package's nor the standard library's or an
    installed package's."""
    where: tuple[str, int | None, str] | None = None
    if isinstance(error, SyntaxError) and error.filename:
        where = (error.filename, error.lineno, error.text or "")
        message = error.msg
    else:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if _users(f.filename)]
        if frames:
            where = (frames[-1].filename, frames[-1].lineno, frames[-1].line or "")
        message = str(error)
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    if where is None:
        return text
    filename, line, code = where
    relative = os.path.relpath(filename)
    return f"{text} (at {filename if relative.startswith('..') else relative}:{line}: {code.strip()})"


def _users(filename: str) -> bool:
    """Whether ``filename`` is the user's code: not frozen (importlib), not this package, not
    the standard library or an installed package."""
    if filename.startswith("<"):
        return False
    path = os.path.realpath(filename)
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    installed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *site.getsitepackages())}
    return not any(path.startswith(root + os.sep) for root in (package, *installed))


def taskset_tasks(module: ModuleType, ref: str, limit: int | None = None) -> list[Task]:
    """The taskset's tasks (the first ``limit``), checked before anything starts.

    Raises:
        UsageError: ``tasks()`` raised, yielded no task, or yielded something not a ``Task``.
    """
    try:
        produced = module.tasks()
        tasks = list(produced if limit is None else itertools.islice(produced, limit))
    except ValidationError as e:  # a task's data (e.g. an empty prompt), on one line
        raise UsageError(f"tasks() of {ref} raised ValidationError: {e.title}: {one_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - the user's code: its failure is one line, not a traceback
        raise UsageError(f"tasks() of {ref} raised {type(e).__name__}: {e}") from None
    if not tasks:
        raise UsageError(f"tasks() of {ref} yielded no tasks; it must yield Task objects")
    for i, task in enumerate(tasks):
        if not isinstance(task, Task):
            raise UsageError(
                f"tasks() of {ref} must yield Task objects (e.g. MyTask({{...}})), "
                f"but item {i} is a {type(task).__name__}"
            )
    return tasks


def taskset_harness(module: ModuleType, ref: str) -> Harness:
    """The taskset's ``harness()``, checked.

    Raises:
        UsageError: it raised, or returned something not a ``Harness``.
    """
    try:
        harness = module.harness()
    except Exception as e:  # noqa: BLE001 - the user's code: its failure is one line, not a traceback
        raise UsageError(f"harness() of {ref} raised {type(e).__name__}: {e}") from None
    if not isinstance(harness, Harness):
        raise UsageError(
            f"harness() of {ref} must return a Harness (e.g. ChatHarness()), got a {type(harness).__name__}"
        )
    return harness
