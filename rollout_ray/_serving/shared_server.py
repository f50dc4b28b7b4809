"""Tool servers shared by a taskset: one HTTP MCP server per node (or per cluster) for all its rollouts.

``SharedToolServer("search", command=[..., "{port}"])`` is a task's toolset like any
``MCPToolset``, but its server is not the rollout's: the first rollout on a node that needs it
starts it (under a lock file, so once per node whichever process asks: rollout actors, the
node's tool server, a local driver), and every later rollout on the node reaches the same one.
Where it is served it is checked: a server whose process is gone or whose port does not answer
is started again (by whoever sees it first), and the process that started it restarts it as
soon as it dies. It is stopped with the process that started it (the kernel sends it SIGTERM
when that process ends: the run's end) or by ``stop_shared_servers``.

With ``scope="cluster"`` one process of the cluster starts and watches it as above (a named
Ray actor: ``_ray/shared_cluster``, which registers itself here as ``CLUSTER``); every opening
asks that actor for its port, which checks it first. The server listens on loopback only: an
opening on the actor's node reaches it there, one on another node gets a client whose requests
the actor relays to it over Ray (``_ray/shared_relay``).

A call still goes through the rollout's own toolset: it lands on that rollout's
``trace.tool_calls`` under that rollout's tool-server bounds, as any MCP call does.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._core.runtime import Runtime
from .._errors import ToolServerError, ToolsetError
from .mcp_client import _Client
from .mcp_toolset import MCPToolset

POLL = 0.05
"""Seconds between two looks at a lock or a port (bounded polls under a deadline)."""


def shared_dir() -> Path:
    """Where a node's shared servers are written down (``ROLLOUT_RAY_SHARED_DIR``, else a
    per-user directory in the temporary directory)."""
    path = Path(os.environ.get("ROLLOUT_RAY_SHARED_DIR") or f"{tempfile.gettempdir()}/rollout_ray-shared-{os.getuid()}")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


class SharedToolServer(MCPToolset):
    """An HTTP MCP server shared by every rollout of a taskset on a node (module docstring).

    Args:
        name: the tool server's name.
        command: the server's argv; ``{port}`` in it is replaced by the loopback port it must
            serve on (e.g. ``[sys.executable, "server.py", "{port}"]``).
        scope: ``"node"`` (one per node) or ``"cluster"`` (one for the whole Ray cluster:
            a named actor holds it; reached over loopback on its node, through the actor from
            every other node).
        path: the MCP endpoint's path on the server.
        ready_timeout: seconds for a started server to answer on its port.
        **kwargs: ``MCPToolset``'s client settings (``timeout``, ``max_connections``, ...).
    """

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        scope: str = "node",
        path: str = "/mcp",
        ready_timeout: float = 60.0,
        **kwargs: Any,
    ) -> None:
        if scope not in ("node", "cluster"):
            raise ToolsetError(f"SharedToolServer {name!r}: scope must be 'node' or 'cluster', got {scope!r}")
        if not command or not any("{port}" in part for part in command):
            raise ToolsetError(
                f"SharedToolServer {name!r}: command must contain '{{port}}', where the "
                "server is told which loopback port to serve on"
            )
        if ready_timeout <= 0:
            raise ToolsetError(f"SharedToolServer {name!r}: ready_timeout must be > 0, got {ready_timeout}")
        super().__init__(name, url="http://127.0.0.1", **kwargs)  # the real URL is the node's server's
        self.shared_command, self.scope, self.path, self.ready_timeout = list(command), scope, path, ready_timeout

    @property
    def key(self) -> str:
        """What names this server on a node (or in the cluster): its name, command and scope."""
        named = (
            [self.name, self.shared_command] if self.scope == "node" else [self.name, self.shared_command, self.scope]
        )
        digest = hashlib.sha256(json.dumps(named).encode()).hexdigest()[:16]
        return f"{self.name}-{digest}"

    async def _open_tools(self, runtime: Runtime | None) -> None:
        if self.scope == "cluster":
            if CLUSTER is None:
                raise ToolServerError(
                    self.name,
                    "scope='cluster' needs Ray (the cluster's one server is held by a Ray actor); "
                    "run on Ray (rollout-ray eval) or use scope='node'",
                )
            reached = await CLUSTER(self)
            if not isinstance(reached, int):  # the server is on another node: its holder relays
                await self._use(reached)
                return
            port = reached
        else:
            port = await ensure_running(self)
        self.url = f"http://127.0.0.1:{port}{self.path}"
        await super()._open_tools(runtime)


@dataclass
class _Started:
    """A server this process started, and the watcher that restarts it."""

    server: SharedToolServer
    process: subprocess.Popen[bytes]
    watcher: asyncio.Task[None] | None = None


CLUSTER: Callable[[SharedToolServer], Awaitable[int | _Client]] | None = None
"""How this process reaches a ``scope="cluster"`` server, checked (and started) by the cluster's
one holder: its loopback port (on the holder's node), else a client relaying through the holder;
set by ``_ray/shared_cluster`` when Ray is in the process."""

_STARTED: dict[str, _Started] = {}
_stopping = False


def _state(server: SharedToolServer) -> dict[str, Any] | None:
    try:
        return json.loads((shared_dir() / f"{server.key}.json").read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours is dead to its users.
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    return True


def _answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _healthy(state: dict[str, Any] | None) -> bool:
    return state is not None and _alive(int(state["pid"])) and _answers(int(state["port"]))


async def ensure_running(server: SharedToolServer) -> int:
    """The port of the node's ``server``, started (or started again) if it is not healthy.

    Raises:
        ToolServerError: it could not be started, or did not answer within ``ready_timeout``.
    """
    state = _state(server)
    if _healthy(state):
        return int(state["port"])  # type: ignore[index]
    async with _node_lock(server):
        state = _state(server)  # another process may have started it while this one waited
        if _healthy(state):
            return int(state["port"])  # type: ignore[index]
        return await _start(server, starts=(state or {}).get("starts", 0) + 1)


@contextlib.asynccontextmanager
async def _node_lock(server: SharedToolServer) -> AsyncIterator[None]:
    """The node's lock on starting ``server`` (a lock file), waited for up to ``ready_timeout``
    twice over (one start under it, and some slack)."""
    deadline = time.monotonic() + 2 * server.ready_timeout
    with open(shared_dir() / f"{server.key}.starting", "a") as f:  # noqa: ASYNC230 - a lock file, opened empty
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ToolServerError(server.name, "another process held the node's start lock too long") from None
                await asyncio.sleep(POLL)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _die_with_parent() -> None:
    # The server is stopped with the process that started it (PR_SET_PDEATHSIG = 1): nothing
    # outlives the run even when its process is killed.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _start(server: SharedToolServer, starts: int) -> int:
    """Start ``server`` on a free loopback port, wait until it answers, write it down."""
    port = _free_port()
    argv = [part.replace("{port}", str(port)) for part in server.shared_command]
    log = open(shared_dir() / f"{server.key}.log", "ab")  # noqa: SIM115, ASYNC230 - the child holds it; opening is not a wait
    try:
        # Started from the event loop's thread: the death signal follows the starting thread.
        # ASYNC220/S603: the taskset's own server command; Popen (not asyncio's) to set the death signal
        process = subprocess.Popen(  # noqa: ASYNC220, S603
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            preexec_fn=_die_with_parent,
            start_new_session=True,
        )
    except OSError as e:
        raise ToolServerError(server.name, f"cannot start {argv[0]!r}: {e}") from e
    finally:
        log.close()
    deadline = time.monotonic() + server.ready_timeout
    while not _answers(port):
        if process.poll() is not None:
            raise ToolServerError(
                server.name,
                f"exited {process.returncode} before serving (its output: {shared_dir() / f'{server.key}.log'})",
            )
        if time.monotonic() > deadline:
            _kill(process)
            raise ToolServerError(server.name, f"did not answer on port {port} within {server.ready_timeout:g}s")
        await asyncio.sleep(POLL)
    tmp = shared_dir() / f"{server.key}.json.tmp"
    tmp.write_text(json.dumps({"pid": process.pid, "port": port, "starts": starts, "by": os.getpid()}))
    tmp.replace(shared_dir() / f"{server.key}.json")
    started = _STARTED[server.key] = _Started(server, process)
    started.watcher = asyncio.get_running_loop().create_task(_watch(started))
    if len(_STARTED) == 1:
        atexit.register(_stop_now)
    return port


async def _watch(started: _Started) -> None:
    """Restart the server as soon as its process dies (not when this process stops it)."""
    await _exited(started.process)
    if _stopping or _STARTED.get(started.server.key) is not started:
        return
    with contextlib.suppress(ToolServerError):  # the next rollout that needs it tries again
        await ensure_running(started.server)


async def _exited(process: subprocess.Popen[bytes]) -> None:
    """Wait for ``process`` to exit: its pidfd becomes readable (no thread, so no wait holds
    up the end of the event loop)."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(process.pid)
    except ProcessLookupError:
        return
    done = loop.create_future()
    loop.add_reader(fd, lambda: None if done.done() else done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    process.poll()  # reap it


def _kill(process: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(grace)


def _stop_now() -> None:
    global _stopping
    _stopping = True
    for started in _STARTED.values():
        _kill(started.process)  # its state stays: a dead pid is unhealthy, and ``starts`` counts on
    _STARTED.clear()


async def stop_shared_servers() -> None:
    """Stop the shared servers this process started (the end of a run, or of a test)."""
    global _stopping
    watchers = [s.watcher for s in _STARTED.values() if s.watcher is not None]
    _stop_now()
    for watcher in watchers:
        watcher.cancel()
    await asyncio.gather(*watchers, return_exceptions=True)
    _stopping = False
