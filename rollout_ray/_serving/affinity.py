"""ServerPool: which of several model servers answers a call: bounded-load affinity per session.

A session's first call goes to the server with the fewest calls in flight (ties rotate). Its
later calls go to the same server, so a multi-turn rollout reuses that server's prefix cache,
as long as that server is not overloaded relative to the others: with ``n`` servers in
rotation and ``m`` calls in flight on them all, a server takes the call while its own calls in
flight plus this one stay within ``ceil(balance * (m + 1) / n)`` (consistent hashing with
bounded loads, Mirrokni et al. 2018; SGLang's cache-aware router and llm-d's scheduler weigh
cache and load the same way). Past the bound the session moves to the least loaded server and
stays there: one cold prefill rather than a queue behind a busy engine while others idle
(prime-rl#3255: pure stickiness left three engines idle and generation 4x slower). The loads
are the calls in flight this pool sees, or the servers' own counts from their ``/metrics``
when larger (other processes' calls; ``server_load.py``). ``routing`` picks another policy, for comparison:
``"sticky"`` (never moves for load), ``"least_loaded"`` and ``"round_robin"`` (every call,
no affinity); ``benchmarks/bench_routing.py`` measures them.

A server's health is judged across sessions, never from one session's requests: a request
can fail because of what it asks (a huge prompt times out), and one rollout must not take a
healthy server away from every rollout of the node. So a server is out of rotation for
``cooldown`` seconds only once ``failing_sessions`` different sessions failed on it since
its last success, and either it could not be reached or ``max_failures`` attempts in a row
failed (a transient status or a timeout). A session that fails on its server moves alone:
at once when the server cannot be reached, after ``max_failures`` failures in a row
otherwise; its new server then keeps it, and the call moves on there at once. After the cooldown the server is tried again.
When every server is out, the one back soonest is tried anyway: a call is never refused
here. A call without a session (a library caller, not a rollout) counts as every session.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from math import ceil
from typing import Literal, get_args

from .._core.model import SESSION_ID

__all__ = ["Routing", "Server", "ServerPool"]

Routing = Literal["affinity", "sticky", "least_loaded", "round_robin"]

_UNKNOWN = "unknown"


@dataclass(eq=False)
class Server:
    """One upstream server and what the pool knows of it."""

    url: str
    """The API root, e.g. ``http://127.0.0.1:8000/v1``."""
    inflight: int = 0
    failures: int = 0
    """Consecutive failed attempts, of any session."""
    failing: set[str] = field(default_factory=set)
    """The sessions with a failed attempt here since its last success."""
    down_until: float = 0.0
    """Out of rotation until this ``clock()`` time."""
    reported: int = 0
    """Requests running and waiting at the server, from its ``/metrics`` (``server_load.py``):
    every client's, where ``inflight`` is this pool's alone."""
    metrics: bool = True
    """Whether it serves a readable ``/metrics`` (``False`` once it did not)."""
    dialect: str | None = _UNKNOWN
    """The token-capture dialect it speaks (``"vllm"``, ``"sglang"``, ``None``); ``"unknown"``
    until detected."""

    @property
    def load(self) -> int:
        """What routing weighs: the larger of the calls in flight seen here and the
        server's own count (which lags by up to a refresh)."""
        return max(self.inflight, self.reported)

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


@dataclass
class _Stick:
    """A session's server, and its own failures there in a row."""

    server: Server
    strikes: int = 0


class ServerPool:
    """Picks a server per call; remembers each session's server (at most ``max_sessions``).

    The session of a call is the context's ``SESSION_ID`` (the rollout's trace id), read by
    ``failed`` and ``succeeded`` too.

    Args:
        urls: the servers' API roots (at least one).
        cooldown: seconds a failed server stays out of rotation.
        max_failures: consecutive failed attempts (transient status, timeout) that take a
            server out, or move one session off it.
        failing_sessions: different sessions that must have failed on a server since its
            last success before it is taken out.
        routing: ``"affinity"`` (bounded-load, the default), ``"sticky"``, ``"least_loaded"``
            or ``"round_robin"`` (see the module docstring).
        balance: how far above the mean load a session's server may be and keep it (>= 1;
            ``"affinity"`` only).
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        cooldown: float = 10.0,
        max_failures: int = 3,
        failing_sessions: int = 2,
        max_sessions: int = 1 << 16,
        routing: Routing = "affinity",
        balance: float = 1.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ValueError("`base_url` must name at least one server")
        if not cooldown >= 0:
            raise ValueError(f"`cooldown` must be >= 0, got {cooldown}")
        if max_failures < 1:
            raise ValueError(f"`max_failures` must be >= 1, got {max_failures}")
        if failing_sessions < 1:
            raise ValueError(f"`failing_sessions` must be >= 1, got {failing_sessions}")
        if routing not in get_args(Routing):
            raise ValueError(f"`routing` must be one of {', '.join(map(repr, get_args(Routing)))}, got {routing!r}")
        if not balance >= 1:
            raise ValueError(f"`balance` must be >= 1 (1: no server above the mean load), got {balance}")
        self.routing, self.balance = routing, balance
        self.servers = [Server(u.rstrip("/")) for u in urls]
        self.cooldown, self.max_failures, self.max_sessions = cooldown, max_failures, max_sessions
        self.failing_sessions = failing_sessions
        self.clock = clock
        self._sticky: OrderedDict[str, _Stick] = OrderedDict()
        self._turn = 0

    def fresh(self) -> ServerPool:
        """A pool of the same servers and settings, knowing nothing yet (for a copy)."""
        return ServerPool(
            [s.url for s in self.servers],
            cooldown=self.cooldown,
            max_failures=self.max_failures,
            failing_sessions=self.failing_sessions,
            max_sessions=self.max_sessions,
            routing=self.routing,
            balance=self.balance,
            clock=self.clock,
        )

    def pick(self, session: str | None) -> Server:
        """The server for the next call of ``session`` (``None``: no affinity)."""
        servers = self.servers
        if len(servers) == 1:
            return servers[0]
        now = self.clock()
        if self.routing == "round_robin":
            up = [s for s in servers if s.down_until <= now] or servers
            self._turn += 1
            return up[self._turn % len(up)]
        if session is not None and self.routing != "least_loaded":
            sticky = self._sticky.get(session)
            if sticky is not None and sticky.server.down_until <= now and self._keeps(sticky.server, now):
                return sticky.server
        server = self._least_loaded(now)
        if session is not None:
            self._stick(session, server)
        return server

    def _keeps(self, server: Server, now: float) -> bool:
        """Whether ``server`` may take one more call of a session it holds: always when
        sticky; within the bounded load otherwise."""
        if self.routing == "sticky":
            return True
        up = [s for s in self.servers if s.down_until <= now]
        bound = ceil(self.balance * (sum(s.load for s in up) + 1) / len(up))
        return server.load + 1 <= bound

    def _least_loaded(self, now: float, besides: Server | None = None) -> Server:
        servers = [s for s in self.servers if s is not besides]
        up = [s for s in servers if s.down_until <= now] or [min(servers, key=lambda s: s.down_until)]
        self._turn += 1
        start = self._turn % len(up)
        return min(up[start:] + up[:start], key=lambda s: s.load)

    def _stick(self, session: str, server: Server) -> None:
        self._sticky[session] = _Stick(server)
        self._sticky.move_to_end(session)
        if len(self._sticky) > self.max_sessions:
            self._sticky.popitem(last=False)

    def succeeded(self, server: Server) -> None:
        server.failures = 0
        server.failing.clear()
        sticky = self._sticky.get(SESSION_ID.get() or "")
        if sticky is not None:
            sticky.strikes = 0

    def failed(self, server: Server, *, unreachable: bool) -> bool:
        """Count a failed attempt of the context's session; returns whether the call can move
        on to another server at once (``server`` was taken out of rotation, or the session
        was moved off it, while another server is in rotation)."""
        session = SESSION_ID.get()
        server.failures += 1
        if session is not None and len(server.failing) < self.failing_sessions:
            server.failing.add(session)
        widely = session is None or len(server.failing) >= self.failing_sessions
        if widely and (unreachable or server.failures >= self.max_failures):
            server.failures = 0
            server.failing.clear()
            now = self.clock()
            server.down_until = now + self.cooldown
            return any(s.down_until <= now for s in self.servers)
        return session is not None and self._strike(session, server, unreachable)

    def _strike(self, session: str, server: Server, unreachable: bool) -> bool:
        """One more failure of ``session`` on its server; past ``max_failures`` in a row (or
        at once if it cannot be reached) the session alone moves to another server."""
        sticky = self._sticky.get(session)
        if sticky is None or sticky.server is not server or len(self.servers) == 1:
            return False
        sticky.strikes += 1
        if not unreachable and sticky.strikes < self.max_failures:
            return False
        now = self.clock()
        other = self._least_loaded(now, besides=server)
        self._stick(session, other)
        return other.down_until <= now

    def session_server(self, session: str) -> Server | None:
        """The server ``session`` is on, if it has one."""
        sticky = self._sticky.get(session)
        return sticky.server if sticky is not None else None
