"""A verifiers v1 taskset, named as users name it, as what ``rollout-ray eval`` runs.

The name is a ``.py`` file, a module, or an installed taskset's id: the module exports its
``Taskset`` subclass in ``__all__`` (upstream's plugin rule, ``load_taskset``). The tasks run
with the ``Harness`` the module exports beside it (upstream's default pairing: a program
harness, ``v1_harness.py``), else with our ``ChatHarness``, as upstream's ``null`` harness runs
them (one chat, the task's tools).
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import sys
import types
from typing import Any

from .._core.task import Task
from .._harnesses.chat import ChatHarness
from .v1_harness import V1Harness
from .v1_task import adapter_class


def v1_taskset(ref: str, limit: int | None = None) -> types.ModuleType:
    """A module with ``tasks()`` (the first ``limit`` tasks, each a ``V1Task``) and
    ``harness()``, for the taskset ``ref``.

    Raises:
        ValueError: in one line: no ``Taskset`` in ``ref``, or a feature of it that is not
            mapped yet (an Env of its own, shared toolsets, toolsets with its own harness, an
            infinite taskset without ``limit``, or one of ``task.refuse_unmapped``'s).
    """
    from verifiers.v1.env import Env
    from verifiers.v1.harness import Harness as UpstreamHarness
    from verifiers.v1.taskset import Taskset

    module = _import(ref)
    exported = [getattr(module, n, None) for n in getattr(module, "__all__", None) or vars(module)]
    found = [c for c in exported if isinstance(c, type) and issubclass(c, Taskset) and c is not Taskset]
    if len(found) != 1:
        raise ValueError(
            f"verifiers taskset {ref}: export exactly one Taskset subclass in __all__ "
            f"(found {[c.__name__ for c in found]})"
        )
    cls = found[0]
    harnesses = [
        c for c in exported if isinstance(c, type) and issubclass(c, UpstreamHarness) and c is not UpstreamHarness
    ]
    envs = [c.__name__ for c in exported if isinstance(c, type) and issubclass(c, Env) and c is not Env]
    if envs:
        raise ValueError(
            f"verifiers taskset {ref}: not mapped onto rollout_ray yet: it defines its own Env "
            f"({envs[0]}: multi-agent episodes); only tasksets run by upstream's single-agent env are"
        )
    tasks = verifiers_tasks(cls(_config_type(cls)()), limit, name=ref)
    harness: Any = ChatHarness
    if harnesses:  # its own program harness, as upstream's loader pairs it (the taskset's id is its id)
        if any(t.toolsets(t.config) for t in tasks):
            raise ValueError(
                f"verifiers taskset {ref}: not mapped onto rollout_ray yet: its tasks have toolsets "
                f"and it pairs its own harness ({harnesses[0].__name__}), which would get no tools here"
            )
        upstream = harnesses[0](_config_type(harnesses[0], "harness").model_validate({"id": ref}))
        harness = lambda: V1Harness(upstream)  # noqa: E731
    out = types.ModuleType(f"rollout_ray_verifiers_{cls.__name__}")
    out.__dict__.update(tasks=lambda: list(tasks), harness=harness)
    return out


def verifiers_tasks(taskset: Any, limit: int | None = None, *, name: str | None = None) -> list[Task]:
    """The tasks of a verifiers v1 ``Taskset`` (or a view of it: ``take``, ``shuffle``, ...)
    as ours, for ``Driver`` with a ``ChatHarness``; the first ``limit`` of them if given. Each
    keeps the v1 task as ``upstream``.

    Raises:
        ValueError: in one line: what of the taskset or of a task is not mapped yet, or an
            infinite taskset without ``limit``.
    """
    name = name or type(taskset).__name__
    if type(taskset).toolsets(taskset.config):
        raise ValueError(f"verifiers taskset {name}: not mapped onto rollout_ray yet: it declares shared toolsets")
    if not taskset.bounded and limit is None:
        raise ValueError(f"verifiers taskset {name} is infinite: give a limit (--limit N), or take(n) of it")
    upstream = itertools.islice(taskset, limit) if limit is not None else taskset
    return [adapter_class(type(t))(t) for t in upstream]  # type: ignore[arg-type]  # a class is hashable; mypy's Hashable misses type[Any]  # every task refused or mapped before any runs


def _config_type(cls: Any, kind: str = "taskset") -> Any:
    from verifiers.v1.configs.harness import HarnessConfig
    from verifiers.v1.configs.taskset import TasksetConfig
    from verifiers.v1.utils.generic import concrete_type

    base = TasksetConfig if kind == "taskset" else HarnessConfig
    return concrete_type(cls, base) or base


def _import(ref: str) -> types.ModuleType:
    """A ``.py`` file by path, else an installed taskset's id or module (``my-env`` and the
    hub id ``owner/my-env@1.0`` are the module ``my_env``, as upstream's loader reads them)."""
    # A hub id (``owner/name@version``) has a slash too: a path only if it is a file there.
    if ref.endswith(".py") or (os.path.sep in ref and os.path.exists(ref)):
        if not os.path.exists(ref):
            raise ValueError(f"no such file: {ref}")
        name = "verifiers_taskset_" + os.path.splitext(os.path.basename(ref))[0]
        spec = importlib.util.spec_from_file_location(name, ref)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its classes pickle by reference to it
        spec.loader.exec_module(module)
        return module
    from verifiers.v1.utils.loaders import import_taskset

    return import_taskset(ref)  # type: ignore[no-any-return]
