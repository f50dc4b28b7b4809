"""HTTPService: the aiohttp server under the interception proxy and the tool server.

Both serve many rollouts at once, each under its own secret, to clients that may be hostile
programs. What they share lives here: binding (``port=0`` picks a free port, ``base_url``
advertises ``advertise_host``), a body cap (413), a bound on how long a client may take to
send its headers (aiohttp's keep-alive timer runs from a connection's start until they are
complete) and then its body (``read_body``: 408), and the tracking of a registration's
requests in flight, so that unregistering it cancels them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

from aiohttp import web

from .._errors import WireError

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
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, advertise_host: str | None = None,
                 max_body: int, read_timeout: float = DEFAULT_READ_TIMEOUT) -> None:
        self.host, self.port = host, port
        self.advertise_host = advertise_host or host
        self.max_body, self.read_timeout = max_body, read_timeout
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
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               keepalive_timeout=self.read_timeout, lingering_time=LINGERING_TIME)
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

    async def read_body(self, request: web.Request) -> bytes:
        """The whole body, within ``read_timeout`` seconds.

        Bounded: a client that sends its headers and then stalls or trickles its body would
        otherwise hold the handler forever (aiohttp has no body deadline).

        Raises:
            WireError: 413 over ``max_body``, 408 too slow, 400 the client hung up.
        """
        try:
            async with asyncio.timeout(self.read_timeout):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise WireError(f"request body over {self.max_body} bytes", status=413) from None
        except TimeoutError:
            raise WireError(f"request body not received within {self.read_timeout:g}s", status=408) from None
        except ConnectionError:  # the client hung up mid-body: nobody to answer, not our bug
            raise WireError("connection lost while reading the request body") from None
