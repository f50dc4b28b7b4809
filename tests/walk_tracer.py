"""The profiler of ``test_walk``: which ``rollout_ray`` files run on one rollout's way.

A module of its own, importing only the package, so that the rollout actor's process loads it
(``walk_site/sitecustomize.py``) without the tests' fixtures.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import rollout_ray

PACKAGE = os.path.dirname(rollout_ray.__file__) + os.sep
OUT_ENV = "ROLLOUT_RAY_WALK_OUT"

ROOTS = {("_driver/attempts.py", "run_attempts"), ("_ray/rollout_actor.py", "submit")}
"""Where the rollout's way starts in each process: the driver's attempts, the actor's submit."""

STACK_ENDS = {("_ray/rollout_client.py", "RunSender.run"), ("_core/rollout.py", "Rollout.run")}
"""Where the spec is handed on no further in each process: the stack of calls that reached
there is the rollout's run stack (``Tracer.on_stack``)."""

_setter: contextvars.ContextVar[Any] = contextvars.ContextVar("walk_setter", default=None)


class Tracer:
    """A profile function: calls ``on_file`` with each ``rollout_ray`` file (relative to the
    package) first entered on the rollout's way. A call is on it when a root is on its stack, or
    when it runs in a task started from such a call (the task's context carries the mark).
    At the first call of a ``STACK_ENDS`` function, ``on_stack`` gets the package's functions
    on its stack, outermost first, as ``file:qualname``."""

    def __init__(self, on_file: Callable[[str], None], on_stack: Callable[[list[str]], None]) -> None:
        self.on_file, self.on_stack = on_file, on_stack
        self.seen: set[str] = set()
        self.ended: set[str] = set()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(PACKAGE):
            return
        try:
            task: Any = asyncio.current_task()
        except RuntimeError:
            task = None
        under_root = False
        f: FrameType | None = frame
        while f is not None:
            code = f.f_code
            if code.co_filename.startswith(PACKAGE) and (code.co_filename[len(PACKAGE) :], code.co_name) in ROOTS:
                under_root = True
                break
            f = f.f_back
        marked_by = _setter.get()
        if under_root:
            if marked_by is None:
                _setter.set(task if task is not None else threading.get_ident())
        elif marked_by is not None and marked_by in (task, threading.get_ident()):
            _setter.set(None)  # the task that started the walk has left it
            return
        elif marked_by is None:
            return
        rel = frame.f_code.co_filename[len(PACKAGE) :]
        if rel not in self.seen:
            self.seen.add(rel)
            self.on_file(rel)
        qualname = frame.f_code.co_qualname
        if (rel, qualname) in STACK_ENDS and qualname not in self.ended:
            self.ended.add(qualname)
            stack, f = [], frame
            while f is not None:
                if f.f_code.co_filename.startswith(PACKAGE):
                    stack.append(f"{f.f_code.co_filename[len(PACKAGE) :]}:{f.f_code.co_qualname}")
                f = f.f_back
            self.on_stack(stack[::-1])


def install_in_worker() -> None:
    """The profiler of a rollout actor's process: each file traced is appended to the
    file named by ``OUT_ENV`` as it is first seen, and each run stack as a line starting
    ``stack`` (the actor is not asked at the end)."""
    out = os.environ.get(OUT_ENV)
    if not out:
        return

    def note(line: str) -> None:
        with open(f"{out}.{os.getpid()}", "a") as f:
            f.write(line + "\n")

    tracer = Tracer(note, lambda stack: note("stack " + " ".join(stack)))
    sys.setprofile(tracer)
    threading.setprofile(tracer)
