"""Batched runs, the actor's side: starts the specs a ``submit`` brought, and hands back every
rollout finished since the last ``collect``, its trace encoded for the wire (``run_sender``
is the driver's side).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any

from .._record.trace import Trace
from .shipment import ShipmentUnpacker
from .trace_wire import Result, portable, trace_to_wire


class RunReceiver:
    """The actor's side of batched runs: runs each submitted spec, and holds its result until
    the next ``collect`` takes it.

    Args:
        run: runs one spec to its trace (``RolloutHost.run``).
    """

    def __init__(self, run: Callable[[Any], Awaitable[Trace]]) -> None:
        self._run = run
        self._unpacker = ShipmentUnpacker()
        self._running: dict[int, asyncio.Task[bytes]] = {}
        self._done: list[Result] = []
        self._ready = asyncio.Event()

    def submit(self, items: list[tuple[int, bytes]], bodies: dict[str, bytes]) -> list[tuple[int, Exception]]:
        """Start each item; returns the items that could not be unpacked, with why."""
        failed: list[tuple[int, Exception]] = []
        for sid, blob in items:
            try:
                spec = self._unpacker.unpack(blob, bodies)
            except Exception as e:  # noqa: BLE001 - that rollout fails (MissingShipment: sent again)
                failed.append((sid, portable(e)))
                continue
            task = asyncio.ensure_future(self._run_for_wire(spec))
            self._running[sid] = task
            task.add_done_callback(partial(self._finished, sid))
        return failed

    async def _run_for_wire(self, spec: Any) -> bytes:
        return trace_to_wire(await self._run(spec))

    def _finished(self, sid: int, task: asyncio.Task[bytes]) -> None:
        self._running.pop(sid, None)
        if task.cancelled():
            result: bytes | BaseException | None = None
        else:
            error = task.exception()
            result = task.result() if error is None else portable(error)
        self._done.append((sid, result))
        self._ready.set()

    async def collect(self) -> list[Result]:
        """Every result since the last call; waits for one while rollouts run."""
        while not self._done and self._running:
            self._ready.clear()
            await self._ready.wait()
        done, self._done = self._done, []
        return done

    def cancel(self, sids: Iterable[int]) -> None:
        for sid in sids:
            task = self._running.get(sid)
            if task is not None:
                task.cancel()

    def __len__(self) -> int:
        return len(self._running)
