"""ServerPool: which of several model servers answers a call, sticky per session.

A session's first call goes to the server with the fewest calls in flight (ties rotate), and
its later calls to the same server, so a multi-turn rollout reuses that server's prefix
cache. A server that cannot be reached, or fails ``max_failures`` times in a row (a
transient status or a timeout), is out of rotation for ``cooldown`` seconds; its sessions
move to another server and stay there. After the cooldown the server is tried again. When
every server is out, the one back soonest is tried anyway: a call is never refused here.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Server", "ServerPool"]

_UNKNOWN = "unknown"


@dataclass(eq=False)
class Server:
    """One upstream server and what the pool knows of it."""

    url: str
    """The API root, e.g. ``http://127.0.0.1:8000/v1``."""
    inflight: int = 0
    failures: int = 0
    """Consecutive failed attempts."""
    down_until: float = 0.0
    """Out of rotation until this ``clock()`` time."""
    dialect: str | None = _UNKNOWN
    """The token-capture dialect it speaks (``"vllm"``, ``"sglang"``, ``None``); ``"unknown"``
    until detected."""

    @property
    def detected(self) -> bool:
        return self.dialect != _UNKNOWN

    @property
    def chat_url(self) -> str:
        return f"{self.url}/chat/completions"

    @property
    def root(self) -> str:
        """The server's root, where its info routes are (``/version``, ``/get_model_info``)."""
        return self.url[:-3] if self.url.endswith("/v1") else self.url


class ServerPool:
    """Picks a server per call; remembers each session's server (at most ``max_sessions``).

    Args:
        urls: the servers' API roots (at least one).
        cooldown: seconds a failed server stays out of rotation.
        max_failures: consecutive failed attempts (transient status, timeout) that take a
            server out; one that cannot be reached is out at once.
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(self, urls: Sequence[str], *, cooldown: float = 10.0, max_failures: int = 3,
                 max_sessions: int = 1 << 16, clock: Callable[[], float] = time.monotonic) -> None:
        if not urls:
            raise ValueError("`base_url` must name at least one server")
        if not cooldown >= 0:
            raise ValueError(f"`cooldown` must be >= 0, got {cooldown}")
        if max_failures < 1:
            raise ValueError(f"`max_failures` must be >= 1, got {max_failures}")
        self.servers = [Server(u.rstrip("/")) for u in urls]
        self.cooldown, self.max_failures, self.max_sessions = cooldown, max_failures, max_sessions
        self.clock = clock
        self._sticky: OrderedDict[str, Server] = OrderedDict()
        self._turn = 0

    def fresh(self) -> ServerPool:
        """A pool of the same servers and settings, knowing nothing yet (for a copy)."""
        return ServerPool([s.url for s in self.servers], cooldown=self.cooldown, max_failures=self.max_failures,
                          max_sessions=self.max_sessions, clock=self.clock)

    def pick(self, session: str | None) -> Server:
        """The server for the next call of ``session`` (``None``: no affinity)."""
        servers = self.servers
        if len(servers) == 1:
            return servers[0]
        now = self.clock()
        if session is not None:
            sticky = self._sticky.get(session)
            if sticky is not None and sticky.down_until <= now:
                return sticky
        up = [s for s in servers if s.down_until <= now] or [min(servers, key=lambda s: s.down_until)]
        self._turn += 1
        start = self._turn % len(up)
        server = min(up[start:] + up[:start], key=lambda s: s.inflight)
        if session is not None:
            self._sticky[session] = server
            self._sticky.move_to_end(session)
            if len(self._sticky) > self.max_sessions:
                self._sticky.popitem(last=False)
        return server

    def succeeded(self, server: Server) -> None:
        server.failures = 0

    def failed(self, server: Server, *, unreachable: bool) -> bool:
        """Count a failed attempt; returns whether it took ``server`` out of rotation while
        another server is in it (the call can move on at once)."""
        server.failures += 1
        if not unreachable and server.failures < self.max_failures:
            return False
        server.failures = 0
        now = self.clock()
        server.down_until = now + self.cooldown
        return any(s.down_until <= now for s in self.servers)

    def session_server(self, session: str) -> Server | None:
        """The server ``session`` is on, if it has one."""
        return self._sticky.get(session)
