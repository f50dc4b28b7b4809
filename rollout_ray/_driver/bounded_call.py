"""A call of user code that may never return, made under a deadline (the group judge's).

The judge is synchronous user code called from the driver's event loop: one that sleeps
forever would wedge the whole run without a word. It runs in a daemon thread instead, and the
caller waits at most ``timeout`` seconds. A thread cannot be killed: one that overran is left
running, and while it runs the same function is not called again (every later call fails at
once, naming the call it hangs in), so a wedged judge costs one timeout, not one per group.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

JUDGE_TIMEOUT = 300.0
"""Seconds a group judge may take on one group (``EvalConfig.judge_timeout``)."""

_hung: dict[Callable[..., Any], tuple[threading.Thread, str, float]] = {}
"""Functions whose last call overran and still runs: its thread, what it was, since when."""
_lock = threading.Lock()


class CallTimeout(TimeoutError):
    """A bounded call did not return in time, or its function still runs from one that did not."""


def call_within(fn: Callable[[Any], T], arg: Any, timeout: float, what: str) -> T:
    """``fn(arg)`` in a daemon thread; its result, or what it raised.

    Raises:
        CallTimeout: it did not return within ``timeout`` seconds (it is left running), or an
            earlier call of ``fn`` that overran still runs (``fn`` is not called).
    """
    with _lock:
        hung = _hung.get(fn)
        if hung is not None and not hung[0].is_alive():
            del _hung[fn]
            hung = None
    if hung is not None:
        _, earlier, since = hung
        if earlier == what:  # the same call again (a caller retrying it): the same answer
            raise CallTimeout(f"{what} did not return within {timeout:g}s")
        raise CallTimeout(f"{what}: not called, it still runs {earlier} (overran {time.monotonic() - since:.0f}s ago)")
    outcome: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, fn(arg)))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread as it was
            outcome.append((False, e))
        finally:
            done.set()

    thread = threading.Thread(target=run, name="rollout-ray-bounded-call", daemon=True)
    thread.start()
    if not done.wait(timeout):
        with _lock:
            _hung[fn] = (thread, what, time.monotonic())
        raise CallTimeout(f"{what} did not return within {timeout:g}s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def still_running() -> int:
    """How many overrun calls still run (their threads cannot be stopped)."""
    with _lock:
        return sum(1 for thread, _, _ in _hung.values() if thread.is_alive())
