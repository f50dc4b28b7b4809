"""The phases of a rollout, in the order they run: each runs code of others (the task's, the
harness's) under its deadline or rule, and raises a typed error for the rollout to record.

* open: ``run_setup`` — task setup then harness setup, under one shared deadline (B11);
  ``harness_data`` — the task data the harness sees, its prompt rewritten once by request
  interceptors (B15).
* step: ``Segment`` — how one segment ended, and the failure it leaves (B22–B30), judged once
  the trace holds what the segment's serving side committed.
* close: ``finalize_and_score`` — the grader's files into the box (the agent is gone), task
  finalize, then task and harness scoring together (B41–B48).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from .._errors import HarnessError, RolloutError, TaskError, boundary
from .._record.messages import Message, Request, SystemMessage, UserMessage
from .._record.trace import Trace
from .aio import gather_all
from .harness import Harness
from .hooks import call_by_name, discover
from .interception import Interception
from .limits import RolloutTimeouts
from .session import RolloutSession
from .task import Task, TaskData

# -- open -----------------------------------------------------------------------------------


def _does_nothing(obj: Any, name: str, base: type) -> bool:
    """``obj``'s ``name`` is ``base``'s own, which does nothing (for ``Harness.score``: when
    the harness has no ``@metric``): calling it under a deadline (a timer, a boundary, a call
    by name, a task) would cost ~10 us per rollout for nothing."""
    return getattr(type(obj), name) is getattr(base, name) and name not in getattr(obj, "__dict__", ())


async def run_setup(task: Task, harness: Harness, trace: Trace, runtime: Any, timeouts: RolloutTimeouts) -> None:
    """Task setup then harness setup, under one shared deadline (B11)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeouts.setup is None else loop.time() + timeouts.setup
    if not _does_nothing(task, "setup", Task):
        with boundary(TaskError, "task setup"):
            async with asyncio.timeout_at(deadline):
                await _task_setup(task, trace, runtime)
    if not _does_nothing(harness, "setup", Harness):
        with boundary(HarnessError, "harness setup"):
            async with asyncio.timeout_at(deadline):
                await harness.setup(runtime)


async def _task_setup(task: Task, trace: Trace, runtime: Any) -> None:
    """The task's setup; a shareable one (``Task.setup_shareable``) runs once per group on a
    machine whose runtimes share it: skipped when the runtime starts from its snapshot (which
    its info names), frozen after it ran otherwise."""
    key = task.setup_key
    if key is not None and await runtime.claim_setup(key) is not None:
        return
    await call_by_name(task.setup, {"trace": trace, "runtime": runtime})
    if key is not None:
        await runtime.freeze_setup()


async def harness_data(
    data: TaskData, harness: Harness, session: RolloutSession, interception: Interception
) -> TaskData:
    """A copy of ``data`` with the harness's resolved system prompt and prompt.

    When the task has request interceptors, the prompt's user turns go through them once
    (no stops), their records land on the trace, and the harness gets the rewritten prompt;
    a string prompt stays a string when one text turn remains. The trace's own task data is
    never changed.
    """
    system, prompt = harness.resolve_prompt(data)
    if prompt is None or not session.request_interceptors:
        return data.model_copy(update={"system_prompt": system, "prompt": prompt})
    if isinstance(prompt, str):
        messages: list[Message] = [UserMessage(prompt)]
    else:
        messages = msgspec.convert(prompt, list[Message])
        system = data.system_prompt
    if system is not None:
        messages.insert(0, SystemMessage(system))
    rewritten = await interception.prepare_users(session, Request(messages))
    # Strip only the system message added above; the prompt's own stay.
    kept = rewritten.messages[1:] if system is not None else list(rewritten.messages)
    new_prompt: Any
    if (
        isinstance(prompt, str)
        and len(kept) == 1
        and isinstance(kept[0], UserMessage)
        and isinstance(kept[0].content, str)
    ):
        new_prompt = kept[0].content
    else:
        new_prompt = msgspec.to_builtins(kept)
    return data.model_copy(update={"system_prompt": system, "prompt": new_prompt})


# -- step -----------------------------------------------------------------------------------


@dataclass
class Segment:
    """How one segment ended, before the trace holds what its proxy committed."""

    turns_before: int
    """Turns on the trace when the segment began."""
    raised: Exception | None = None
    """What the harness raised, if anything."""
    expired: bool = False
    """The agent budget ran out during the segment."""

    def failure(self, session: RolloutSession, agent_budget: float | None) -> Exception | None:
        """The error to record for the segment, or ``None`` (it raised nothing, or it was
        refused because the session stopped)."""
        error = self.raised
        if error is None:
            return None
        if isinstance(error, TimeoutError):
            if not self.expired:
                return error
            timeout = HarnessError(f"agent timeout: rollout exceeded its {agent_budget:g}s budget")
            timeout.__cause__ = error
            return timeout
        if session.stopped:
            return None
        stashed = session.error
        if isinstance(error, RolloutError) and stashed is not None:
            stashed.__cause__ = error
            return stashed
        return error


# -- close ----------------------------------------------------------------------------------


async def finalize_and_score(
    task: Task, harness: Harness, trace: Trace, runtime: Any, timeouts: RolloutTimeouts
) -> None:
    """Task finalize, then task and harness scoring concurrently, each under its timeout."""
    timing = trace.timing
    timing.finalize.start = time.time()
    files = task.grader_files()
    if files:  # the agent is gone: its box gets what it must never have seen
        with boundary(TaskError, "grader files"):
            async with asyncio.timeout(timeouts.finalize):
                runtime.grader_dir = await runtime.add_grader_files(files)
    if not _does_nothing(task, "finalize", Task):
        with boundary(TaskError, "task finalize"):
            async with asyncio.timeout(timeouts.finalize):
                await call_by_name(task.finalize, {"trace": trace, "runtime": runtime})
    timing.finalize.end = timing.scoring.start = time.time()
    scoring = [task.score(trace, runtime)]
    if not (_does_nothing(harness, "score", Harness) and not discover(harness, "metric")):
        scoring.append(harness.score(trace, runtime, task.data))  # else one: run inline, no tasks
    with boundary(TaskError, "scoring"):
        async with asyncio.timeout(timeouts.scoring):
            await gather_all(scoring)
    timing.scoring.end = time.time()
