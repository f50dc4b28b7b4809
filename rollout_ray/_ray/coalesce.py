"""Coalescer: many small calls to one remote service, sent as few batched calls.

A rollout actor hosting a hundred rollouts registers and unregisters each one with its
node's services actor. Each actor call has a fixed CPU cost on both sides, and the
calls come in bursts (rollouts start and end together), so sending them one by one spends
the node's cores on call overhead just when they are scarce. A ``Coalescer`` keeps at most
one batch in flight: a call made while the service is idle leaves at once (in a batch of
one, so light load pays no extra latency), and calls made meanwhile wait for it and leave
together. Batches grow with load by themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

A = TypeVar("A")
R = TypeVar("R")

SendBatch = Callable[[list[A]], Awaitable[list["R | BaseException"]]]
"""Sends a batch; returns one result per item, in order, or that item's exception."""


class Coalescer(Generic[A, R]):
    """``await coalescer(item)`` → that item's result, sent in a batch with its neighbours.

    Args:
        send: the batched call. If it raises, every item of its batch raises that error.
        max_batch: the largest batch sent at once.
    """

    def __init__(self, send: SendBatch[A, R], *, max_batch: int = 256) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._send = send
        self._max_batch = max_batch
        self._queue: list[tuple[A, asyncio.Future[R]]] = []
        self._sender: asyncio.Task[None] | None = None
        self.batches = 0
        self.items = 0

    async def __call__(self, item: A) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        # Runs while there is work; the next call after it ends starts a new one.
        while True:
            self._queue = [(i, f) for i, f in self._queue if not f.cancelled()]
            if not self._queue:
                return
            batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
            self.batches += 1
            self.items += len(batch)
            try:
                results = await self._send([item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"batched call answered {len(results)} results for {len(batch)} items")
            except BaseException as e:  # also cancellation: no caller may wait forever
                for _, future in batch:
                    if not future.done():
                        future.set_exception(e if isinstance(e, Exception) else RuntimeError("batch cancelled"))
                if not isinstance(e, Exception):
                    self._fail_queued(RuntimeError("batch cancelled"))
                    raise
                continue
            for (_, future), result in zip(batch, results):
                if future.done():
                    continue  # its caller was cancelled meanwhile
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    def _fail_queued(self, error: Exception) -> None:
        queued, self._queue = self._queue, []
        for _, future in queued:
            if not future.done():
                future.set_exception(error)
