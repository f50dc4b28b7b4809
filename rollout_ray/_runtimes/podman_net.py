"""A Podman container's network: none but the routes ``prepare_execution`` allows.

The container runs with ``--network none`` (its own network namespace, only loopback): it
reaches no host port, Ray's included. Each allowed route is served inside it on
``127.0.0.1:PORT`` by the sandbox's ``forwarder.py``, run by *this* host's Python in the
container's network namespace only (``nsenter --net``: the image needs no Python, and the
forwarder's files and sockets are the host's), which relays every connection to a unix socket
of the host where a ``Route`` connects to the real URL — as ``SandboxRuntime`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence

from .._errors import SandboxError
from .routes import Route, wanted_routes

FORWARDER = os.path.join(os.path.dirname(__file__), "forwarder.py")
_HOLD = "import sys; sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()"
"""The forwarder's program: says the listeners are up (they are before it starts), then
lives until its stdin closes."""


class ContainerNetwork:
    """The routes of one container, served in its network namespace (see the module doc)."""

    def __init__(self, directory: str, env: Mapping[str, str]) -> None:
        self.directory, self.env = directory, dict(env)  # env: the host's marker, for its guardian
        self.routes: dict[int, Route] = {}
        self.forwarder: asyncio.subprocess.Process | None = None

    async def allow(
        self, pid: int, routes: Sequence[str] | None, remote: Mapping[int, tuple[str, int]], name: str
    ) -> None:
        """Serve exactly ``routes`` in the network namespace of host process ``pid``."""
        wanted = wanted_routes(routes, remote)
        if self.forwarder is not None and {p: (r.host, r.port) for p, r in self.routes.items()} == wanted:
            return
        await self.close()
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        for port, (host, target_port) in wanted.items():
            route = self.routes[port] = Route(host, target_port)
            await route.open(os.path.join(self.directory, f"{port}.sock"))
        if not wanted:
            return
        command = [
            shutil.which("nsenter") or "nsenter",
            f"--net=/proc/{pid}/ns/net",
            "--",
            sys.executable,
            "-I",
            "-S",
            FORWARDER,
            *(a for port in wanted for a in ("--route", f"{port}={port}.sock")),
            "--",
            sys.executable,
            "-I",
            "-S",
            "-c",
            _HOLD,
        ]
        self.forwarder = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            start_new_session=True,
            cwd=self.directory,
        )  # relative socket paths: a unix socket's path is limited to 107 bytes
        assert self.forwarder.stdout is not None and self.forwarder.stderr is not None
        async with asyncio.timeout(30):
            ready = await self.forwarder.stdout.readline()
        if ready != b"ready\n":
            why = (await self.forwarder.stderr.read(2000)).decode(errors="replace").strip()
            await self.close()
            raise SandboxError(
                f"runtime {name!r}: cannot serve its routes in its container: {why or 'no reason given'}"
            )

    async def close(self) -> None:
        forwarder, self.forwarder = self.forwarder, None
        if forwarder is not None and forwarder.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(forwarder.pid, signal.SIGKILL)
            await forwarder.wait()
        for route in self.routes.values():
            await route.close()
        self.routes = {}
