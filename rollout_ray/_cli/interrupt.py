"""What SIGINT and SIGTERM do to a command: eval's and sweep's run ends with what is stored
kept (``Signals``), a server (``serve-model``, ``view``) stops (``serve_until_signal``)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

Stop = Callable[[], Awaitable[object]]


class Signals:
    """SIGINT and SIGTERM cancel the run (what is stored stays); a second one exits at once."""

    def __init__(self) -> None:
        self.received: int | None = None

    def install(self) -> None:
        """(Again after Ray starts: ``ray.init`` sets its own SIGTERM handler.)"""
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._on_signal, signum, task)

    def _on_signal(self, signum: int, task: asyncio.Task[Any] | None) -> None:
        if self.received is not None:
            os._exit(128 + self.received)  # a second signal: the user will not wait for the cleanup
        self.received = signum
        if task is not None:  # install() runs in a task: there is one
            task.cancel()


async def serve_until_signal(start: Callable[[], Awaitable[tuple[str, Stop]]], announce: Callable[[str], None]) -> None:
    """Start a server, announce its URL, serve until SIGINT or SIGTERM, then stop it and give
    both signals their previous handlers back.

    ``start()`` binds and returns ``(url, stop)``. The handlers are in place before it runs, so
    a signal that arrives while the server starts stops it as soon as it is up.
    """
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in previous:
        loop.add_signal_handler(signum, stopped.set)
    try:
        url, stop = await start()
        try:
            announce(url)
            await stopped.wait()
        finally:
            await stop()
    finally:
        for signum, handler in previous.items():
            loop.remove_signal_handler(signum)
            signal.signal(signum, handler)
