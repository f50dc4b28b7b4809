"""Caps on sandbox creation: how many start at once, and how many a second, per node and per
cluster, so a run of 10,000 rollouts does not start 10,000 boxes at once.

A ``StartGate`` is entered around the part of a sandbox's start that costs the node (its
directories, mounts and cgroups; not unpacking its image, which the image cache does once):
``async with gate.admit(): ...``. ``NodeStartGate`` holds the node's caps across every process of the
node, with files and ``flock``: a start holds one of ``concurrency`` slot locks (the kernel
drops it if its process dies), and takes a token from a bucket refilled at ``per_second``,
kept in a locked state file. The cluster's gate lives in the Ray layer (one actor for the
cluster); a host enters every gate it was given (``admitted``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import struct
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from .layout import _cache_dir

POLL = 0.005
"""Seconds between looks at a slot or a token another process of the node holds."""


@dataclass(frozen=True)
class StartLimits:
    """How many sandboxes may start at once, and how many a second (``None``: no cap)."""

    concurrency: int | None = None
    per_second: float | None = None

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"`concurrency` of sandbox starts must be >= 1 or None, got {self.concurrency}")
        if self.per_second is not None and not self.per_second > 0:
            raise ValueError(f"`per_second` of sandbox starts must be > 0 or None, got {self.per_second}")

    @classmethod
    def from_environment(cls) -> StartLimits:
        """The node's caps: ``ROLLOUT_RAY_NODE_STARTS`` (at once; default twice the node's
        CPUs, at least 4) and ``ROLLOUT_RAY_NODE_START_RATE`` (a second; default none)."""
        starts = os.environ.get("ROLLOUT_RAY_NODE_STARTS")
        rate = os.environ.get("ROLLOUT_RAY_NODE_START_RATE")
        return cls(int(starts) if starts else max(4, 2 * (os.cpu_count() or 1)), float(rate) if rate else None)


class StartGate(Protocol):
    def admit(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Entered around one start: waits for room, holds it until the start is done."""
        ...


class NodeStartGate:
    """The node's caps, shared through ``directory`` by every process that uses it."""

    def __init__(self, directory: str, limits: StartLimits) -> None:
        self.directory = directory
        self.limits = limits
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.waited = 0.0
        """Seconds this process's starts waited at the gate, in all."""

    @contextlib.asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        started = time.monotonic()
        slot = None if self.limits.concurrency is None else await self._slot(self.limits.concurrency)
        try:
            if self.limits.per_second is not None:
                while (wait := self._token(self.limits.per_second)) > 0:  # noqa: ASYNC110 - a token bucket: the wait is computed, no event to wait for
                    await asyncio.sleep(wait)
            self.waited += time.monotonic() - started
            yield
        finally:
            if slot is not None:
                os.close(slot)

    async def _slot(self, slots: int) -> int:
        """A descriptor holding one of the node's ``slots`` start locks (waits for a free one)."""
        while True:
            for i in range(slots):
                fd = os.open(
                    os.path.join(self.directory, f"slot-{i}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
                )
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
                except BlockingIOError:
                    os.close(fd)
            await asyncio.sleep(POLL)  # held by other processes: nothing here can signal us

    def _token(self, per_second: float) -> float:
        """Take a token from the node's bucket (``0.0``), or say how long until one is due.
        The bucket holds at most one second's worth: a quiet node may start a burst of that."""
        fd = os.open(os.path.join(self.directory, "rate.state"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for microseconds by whoever has it
            raw = os.pread(fd, 16, 0)
            now = time.time()  # shared by processes: the wall clock, not one's monotonic clock
            tokens, then = struct.unpack("dd", raw) if len(raw) == 16 else (per_second, now)
            tokens = min(max(per_second, 1.0), tokens + max(0.0, now - then) * per_second)
            if tokens < 1.0:
                return (1.0 - tokens) / per_second  # type: ignore[no-any-return]
            os.pwrite(fd, struct.pack("dd", tokens - 1.0, now), 0)
            return 0.0
        finally:
            os.close(fd)


@functools.cache
def node_gate() -> NodeStartGate:
    """This node's gate, with the caps the environment sets (``StartLimits.from_environment``),
    shared through the user's cache directory (else a private one: then per process)."""
    directory = _cache_dir() or tempfile.mkdtemp(prefix="rollout-ray-starts-")
    return NodeStartGate(os.path.join(directory, "starts"), StartLimits.from_environment())


@contextlib.asynccontextmanager
async def admitted(gates: Sequence[StartGate]) -> AsyncIterator[None]:
    """Through every gate of a host, in order (the node's, then the cluster's)."""
    async with contextlib.AsyncExitStack() as stack:
        for gate in gates:
            await stack.enter_async_context(gate.admit())
        yield
