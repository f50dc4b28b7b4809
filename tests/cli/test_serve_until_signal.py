"""``serve-model`` and ``view`` serve until SIGINT or SIGTERM through one loop
(``_cli/interrupt.serve_until_signal``); the commands themselves are run in test_cli.py and
tests/viewer/test_viewer_api.py."""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import pytest

from rollout_ray._cli.interrupt import Stop, serve_until_signal
from rollout_ray._simulated.model_server import SimulatedModelServer


def _port(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_server_and_gives_both_handlers_back(signum: int) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    announced: list[str] = []

    async def start() -> tuple[str, Stop]:
        server = SimulatedModelServer()
        return await server.start(), server.stop

    def announce(url: str) -> None:
        announced.append(url)
        with socket.create_connection(("127.0.0.1", _port(url)), timeout=5):
            pass  # it listens once announced
        os.kill(os.getpid(), signum)

    asyncio.run(serve_until_signal(start, announce))
    (url,) = announced
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", _port(url)), timeout=5).close()
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_signal_while_the_server_starts_stops_it_once_it_is_up() -> None:
    steps: list[str] = []

    async def start() -> tuple[str, Stop]:
        os.kill(os.getpid(), signal.SIGTERM)  # caught by the loop's handler, not the process's default

        async def stop() -> None:
            steps.append("stopped")

        steps.append("started")
        return "http://127.0.0.1:9/", stop

    asyncio.run(serve_until_signal(start, lambda url: steps.append(url)))
    assert steps == ["started", "http://127.0.0.1:9/", "stopped"]
