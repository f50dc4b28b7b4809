"""eval's interruption: SIGINT and SIGTERM end the run with what is stored kept, and one line
that says how to continue it."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any


class Signals:
    """SIGINT and SIGTERM cancel the run (what is stored stays); a second one exits at once."""

    def __init__(self) -> None:
        self.received: int | None = None

    def install(self) -> None:
        """(Again after Ray starts: ``ray.init`` sets its own SIGTERM handler.)"""
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._on_signal, signum, task)

    def _on_signal(self, signum: int, task: asyncio.Task[Any]) -> None:
        if self.received is not None:
            os._exit(128 + self.received)  # a second signal: the user will not wait for the cleanup
        self.received = signum
        task.cancel()
