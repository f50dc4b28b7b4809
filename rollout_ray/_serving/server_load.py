"""The servers' own load, read from their Prometheus ``/metrics`` for routing (``affinity.py``).

The calls in flight a pool counts are only its own process's; a server's ``/metrics`` tells
what it runs and queues for every client: vLLM's ``vllm:num_requests_running`` and
``vllm:num_requests_waiting``, SGLang's ``sglang:num_running_reqs`` and
``sglang:num_queue_reqs`` (summed over their label sets: engines, models). A server whose
``/metrics`` is missing or unreadable is not asked again; its load is then the calls in flight
alone.

Loads are refreshed at most every ``interval`` seconds, by the call that finds them stale,
bounded by ``timeout``; concurrent calls meanwhile route on the values they have (no call
waits for another's refresh).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from .affinity import Server, ServerPool

__all__ = ["LoadReader", "parse_load"]

_LOAD_METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
)


def parse_load(text: str) -> int | None:
    """Requests running and waiting in a Prometheus text exposition; ``None``: none of the
    known metrics is there (not a vLLM or SGLang server)."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(_LOAD_METRICS):
            continue
        name, _, value = line.rpartition(" ")
        if name.split("{", 1)[0] not in _LOAD_METRICS:
            continue
        try:
            total += float(value)
        except ValueError:
            continue
        found = True
    return round(total) if found else None


class LoadReader:
    """Keeps a pool's ``Server.reported`` loads fresh (several servers only)."""

    def __init__(
        self,
        pool: ServerPool,
        *,
        interval: float = 1.0,
        timeout: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool, self.interval, self.timeout, self.clock = pool, interval, timeout, clock
        self._at = float("-inf")
        self._busy = False

    async def refresh(self, client: aiohttp.ClientSession) -> None:
        """Read the loads if they are stale and nobody is reading them already."""
        servers = [s for s in self.pool.servers if s.metrics]
        if len(self.pool.servers) < 2 or not servers or self._busy or self.clock() - self._at < self.interval:
            return
        self._busy = True
        try:
            await asyncio.gather(*[self._read(client, s) for s in servers])
        finally:
            self._busy, self._at = False, self.clock()

    async def _read(self, client: aiohttp.ClientSession, server: Server) -> None:
        try:
            async with client.get(f"{server.root}/metrics", timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                text = await resp.text() if resp.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return  # unreachable now: the pool's failure handling judges that, the old value stands
        load = parse_load(text)
        if load is None:
            server.metrics = False
        else:
            server.reported = load
