"""HTTPService: the aiohttp server under the interception proxy and the tool server.

Both serve many rollouts at once, each under its own secret, to clients that may be hostile
programs. What they share lives here: binding (``port=0`` picks a free port, ``base_url``
advertises ``advertise_host``), a body cap (413), a bound on how long a client may take to
send its headers (aiohttp's keep-alive timer runs from a connection's start until they are
complete) and then its body (``read_body``: 408), and the tracking of a registration's
requests in flight, so that unregistering it cancels them.

And the bounds on memory (``admitted``), checked before a body is read, whose bytes are
reserved as declared (``max_body`` when undeclared, until read) for as long as its request
is handled: one rollout's requests and body bytes in flight (429 beyond its share), and the
body bytes in flight of every rollout of the servers that share a ``BodyBudget`` (a node's
proxy and tool server: 503 with ``Retry-After`` beyond it). So no rollout, and no set of
rollouts, grows a node's services past a bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Self

from aiohttp import web

from .._errors import WireError

DEFAULT_MAX_BODY_BYTES_IN_FLIGHT = 64 << 20
"""Request body bytes a server (a node's proxy and tool server together) holds at once."""

DEFAULT_READ_TIMEOUT = 60.0
"""Seconds a client has to send a request's headers, and then its whole body."""

LINGERING_TIME = 1.0
"""Seconds the server goes on reading (and dropping) a body it refused without reading, so
that the client, still sending, gets to read the refusal. aiohttp's default is 10 s, which
a client that stops sending turns into 10 s of a held connection."""


class Handlers:
    """The request handlers of one registration that are running now."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    @contextmanager
    def track(self) -> Iterator[None]:
        """Count the current task among them for the length of the block."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            yield
        finally:
            self._tasks.discard(task)

    def cancel(self) -> None:
        """Cancel every one of them (the registration ended: no late answer may land)."""
        for task in list(self._tasks):
            task.cancel()


class BodyBudget:
    """Request body bytes in flight, across every registration of the servers sharing it."""

    def __init__(self, limit: int = DEFAULT_MAX_BODY_BYTES_IN_FLIGHT) -> None:
        if limit < 1:
            raise ValueError(f"`limit` must be >= 1 byte, got {limit}")
        self.limit = limit
        self.held = 0
        self.peak = 0
        """The most bytes held at once (for the tests' and benchmarks' figures)."""


@dataclass
class InFlight:
    """One registration's requests in flight, and the body bytes reserved for them."""

    requests: int = 0
    body_bytes: int = 0


class Refused(Exception):
    """A request answered before its body is read (``status``: 413, 429 or 503)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Reservation:
    """The body bytes reserved for one request; ``settle`` shrinks it to the body read."""

    def __init__(self, budget: BodyBudget, inflight: InFlight, size: int) -> None:
        self._budget, self._inflight, self.size = budget, inflight, size
        budget.held += size
        budget.peak = max(budget.peak, budget.held)
        inflight.requests += 1
        inflight.body_bytes += size

    def settle(self, actual: int) -> None:
        if actual < self.size:
            self._budget.held -= self.size - actual
            self._inflight.body_bytes -= self.size - actual
            self.size = actual

    def release(self) -> None:
        self._budget.held -= self.size
        self._inflight.body_bytes -= self.size
        self._inflight.requests -= 1
        self.size = 0


class HTTPService:
    """An aiohttp server; subclasses add their routes in ``_routes``.

    ``await start()`` before use, ``await stop()`` at the end (or ``async with``).

    Args:
        host: interface to bind; loopback unless clients on other machines must reach it.
        port: 0 picks a free port.
        advertise_host: the host put in ``base_url`` (default: ``host``).
        max_body: request bodies larger than this are answered 413.
        read_timeout: a request's headers, and then its whole body, must arrive within this
            many seconds (else the connection is closed, or the request answered 408).
        max_requests_per_rollout / max_body_bytes_per_rollout: what one registration may have
            in flight at once (``admitted``; ``None``: no share, for a server whose callers are
            not rollouts, such as a driver's control server).
        body_budget: the body bytes in flight it shares with other servers (default: its own,
            of ``DEFAULT_MAX_BODY_BYTES_IN_FLIGHT``).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise_host: str | None = None,
        max_body: int,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        max_requests_per_rollout: int | None = None,
        max_body_bytes_per_rollout: int | None = None,
        body_budget: BodyBudget | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.advertise_host = advertise_host or host
        self.max_body, self.read_timeout = max_body, read_timeout
        self.max_requests_per_rollout = max_requests_per_rollout
        self.max_body_bytes_per_rollout = max_body_bytes_per_rollout
        self.body_budget = body_budget or BodyBudget()
        self.base_url = ""
        self._runner: web.AppRunner | None = None

    def _routes(self, router: web.UrlDispatcher) -> None:
        raise NotImplementedError

    async def start(self) -> str:
        """Bind and serve; returns ``base_url``.

        Raises:
            OSError: the address cannot be bound.
        """
        app = web.Application(client_max_size=self.max_body)
        self._routes(app.router)
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=self.read_timeout,
            lingering_time=LINGERING_TIME,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]
        self.base_url = f"http://{self.advertise_host}:{self.port}"
        return self.base_url

    async def stop(self) -> None:
        """Close every connection and the socket; idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @contextmanager
    def admitted(self, request: web.Request, inflight: InFlight) -> Iterator[Reservation]:
        """Reserve ``request``'s body bytes for the block, before it is read.

        Raises:
            Refused: 413 a declared body over ``max_body``; 429 the registration has
                ``max_requests_per_rollout`` requests or ``max_body_bytes_per_rollout`` body
                bytes in flight; 503 the shared ``body_budget`` is spent.
        """
        declared = request.content_length
        size = self.max_body if declared is None else declared
        budget = self.body_budget
        if declared is not None and declared > self.max_body:
            raise Refused(413, f"request body over {self.max_body} bytes")
        if self.max_requests_per_rollout is not None and inflight.requests >= self.max_requests_per_rollout:
            raise Refused(429, f"more than {self.max_requests_per_rollout} requests of this rollout in flight")
        if self.max_body_bytes_per_rollout is not None and inflight.body_bytes + size > self.max_body_bytes_per_rollout:
            raise Refused(429, f"more than {self.max_body_bytes_per_rollout} body bytes of this rollout in flight")
        if budget.held + size > budget.limit:
            raise Refused(503, f"the node holds {budget.limit} body bytes in flight; retry shortly")
        reservation = Reservation(budget, inflight, size)
        try:
            yield reservation
        finally:
            reservation.release()

    @staticmethod
    def refusal_headers(refused: Refused) -> dict[str, str]:
        """What a refusal's answer says besides its body: when to come back, if at all."""
        return {"Retry-After": "1"} if refused.status == 503 else {}

    async def read_body(self, request: web.Request, reservation: Reservation | None = None) -> bytes:
        """The whole body, within ``read_timeout`` seconds; ``reservation`` shrinks to its size.

        Bounded: a client that sends its headers and then stalls or trickles its body would
        otherwise hold the handler forever (aiohttp has no body deadline).

        Raises:
            WireError: 413 over ``max_body``, 408 too slow, 400 the client hung up.
        """
        try:
            async with asyncio.timeout(self.read_timeout):
                body = await request.read()
            if reservation is not None:
                reservation.settle(len(body))
            return body
        except web.HTTPRequestEntityTooLarge:
            raise WireError(f"request body over {self.max_body} bytes", status=413) from None
        except TimeoutError:
            raise WireError(f"request body not received within {self.read_timeout:g}s", status=408) from None
        except ConnectionError:  # the client hung up mid-body: nobody to answer, not our bug
            raise WireError("connection lost while reading the request body") from None
