"""A tiny Chrome DevTools Protocol client: start headless Chromium, drive one page, take pictures.

Only what the viewer's browser test needs: ``Browser.launch`` starts the binary with its own
profile and ``--remote-debugging-port=0`` and reads the port it chose from its
``DevTools listening on ws://...`` line; ``Page`` sends commands over aiohttp's websocket
client and waits on DOM conditions inside the page (a ``MutationObserver`` with a deadline),
never by sleeping. ``close`` ends the browser it started, by PID (its process group last),
and returns once every process of that group has exited.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import itertools
import json
import os
import shutil
import signal
import urllib.parse
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    "--window-size=1280,1000",
)


def find_chromium() -> str | None:
    """Debian's ``/usr/bin/chromium``, or a chromium on PATH; None when there is none."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


class CDPError(RuntimeError):
    """A command answered with an error, or a page script threw."""


class Browser:
    """One headless Chromium process, started and ended by this object."""

    def __init__(self, proc: asyncio.subprocess.Process, port: int, session: aiohttp.ClientSession) -> None:
        self.proc, self.port, self.session = proc, port, session
        self.log: collections.deque[str] = collections.deque(maxlen=200)
        self._drain = asyncio.create_task(self._read_log())

    @classmethod
    async def launch(cls, binary: str, user_data_dir: Path, timeout: float = 30) -> Browser:
        proc = await asyncio.create_subprocess_exec(
            binary,
            *FLAGS,
            f"--user-data-dir={user_data_dir}",
            "--remote-debugging-port=0",
            "about:blank",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its helpers share its process group, so close() reaches them all
        )
        try:
            # The port is read off the stderr line, not DevToolsActivePort: under load the line
            # can come while that file is still empty.
            banner = await asyncio.wait_for(cls._devtools_banner(proc), timeout)
            port = urllib.parse.urlsplit(banner).port
            if port is None:
                raise CDPError(f"no port in chromium's DevTools line: {banner!r}")
        except BaseException:
            await _end(proc)
            raise
        return cls(proc, port, aiohttp.ClientSession())

    @staticmethod
    async def _devtools_banner(proc: asyncio.subprocess.Process) -> str:
        assert proc.stderr is not None
        seen = []
        while line := (await proc.stderr.readline()).decode(errors="replace"):
            if line.startswith("DevTools listening on "):
                return line.removeprefix("DevTools listening on ").strip()
            seen.append(line)
        raise CDPError(f"chromium exited with {await proc.wait()} before listening:\n{''.join(seen[-20:])}")

    async def _read_log(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():  # keep the pipe drained
            self.log.append(line.decode(errors="replace"))

    async def page(self) -> Page:
        """The browser's first tab (``about:blank``), connected."""
        async with self.session.get(f"http://127.0.0.1:{self.port}/json/list") as response:
            targets = await response.json()
        target = next(t for t in targets if t["type"] == "page")
        ws = await self.session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
        page = Page(ws)
        await page.send("Page.enable")
        await page.send("Runtime.enable")
        return page

    async def close(self) -> None:
        await self.session.close()
        await _end(self.proc)
        await self._drain


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, process group)`` of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[2])


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (from /proc)."""
    stats = {int(e): _stat(int(e)) for e in os.listdir("/proc") if e.isdigit()}
    return [pid for pid, st in stats.items() if st is not None and st[1] == pgid and st[0] != "Z"]


async def _exited(pidfd: int) -> None:
    """Until the process behind ``pidfd`` has exited (the fd turns readable)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(pidfd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(pidfd)


async def wait_group_gone(pgid: int, timeout: float = 20) -> None:
    """Until process group ``pgid`` has no live member: each one's exit is awaited on its
    pidfd. A SIGKILLed helper is still listed while the kernel tears it down (under load, for
    a while), so asserting right after the signal would count the dying.

    Raises:
        TimeoutError: members are still alive after ``timeout`` seconds (they are named).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while members := group_members(pgid):
        for pid in members:
            try:
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            try:
                if (_stat(pid) or ("", -1))[1] != pgid:  # gone, and the pid taken by another
                    continue
                async with asyncio.timeout_at(deadline):
                    await _exited(pidfd)
            except TimeoutError:
                raise TimeoutError(
                    f"process group {pgid} still has {group_members(pgid)} {timeout}s after SIGKILL"
                ) from None
            finally:
                os.close(pidfd)


async def _end(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the browser and wait for it; SIGKILL what is left of its process group."""
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            pass
    # The group was made by start_new_session for this browser; while it has a live member
    # its id cannot have been reused, so this reaches only helpers the browser left behind.
    if group_members(proc.pid):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    await proc.wait()
    await wait_group_gone(proc.pid)


class Page:
    """One tab over its DevTools websocket: commands, events, scripts and screenshots."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.waiters: dict[str, list[asyncio.Future[dict[str, Any]]]] = {}
        self.errors: list[str] = []
        """Uncaught exceptions and console errors of the page, as text."""
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(message.data)
            if "id" in data:
                future = self.pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
                continue
            method, params = data.get("method"), data.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                self.errors.append(details.get("exception", {}).get("description") or details.get("text", "?"))
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                self.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            for future in self.waiters.pop(method, []):
                if not future.done():
                    future.set_result(params)
        for future in self.pending.values():
            if not future.done():
                future.set_exception(CDPError("the DevTools connection closed"))

    async def send(self, method: str, timeout: float = 30, **params: Any) -> dict[str, Any]:
        """Send one command and return its result. Raises CDPError on an error answer."""
        command_id = next(self.ids)
        future = asyncio.get_running_loop().create_future()
        self.pending[command_id] = future
        await self.ws.send_json({"id": command_id, "method": method, "params": params})
        answer = await asyncio.wait_for(future, timeout)
        if "error" in answer:
            raise CDPError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def event(self, method: str) -> asyncio.Future[dict[str, Any]]:
        """A future for the next ``method`` event; take it before causing the event."""
        future = asyncio.get_running_loop().create_future()
        self.waiters.setdefault(method, []).append(future)
        return future

    async def navigate(self, url: str, timeout: float = 30) -> None:
        loaded = self.event("Page.loadEventFired")
        await self.send("Page.navigate", url=url)
        await asyncio.wait_for(loaded, timeout)

    async def evaluate(self, expression: str, timeout: float = 30) -> Any:
        """The JSON value of ``expression`` in the page (a promise is awaited)."""
        result = await self.send(
            "Runtime.evaluate", timeout=timeout + 5, expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise CDPError(details.get("exception", {}).get("description") or details.get("text"))
        return result["result"].get("value")

    async def wait_for(self, condition: str, timeout: float = 15) -> Any:
        """Wait until the JS expression ``condition`` is truthy (checked at every DOM change)."""
        script = f"""new Promise((resolve, reject) => {{
          const check = () => {{ try {{ return ({condition}); }} catch (e) {{ return false; }} }};
          const now = check();
          if (now) return resolve(now);
          const timer = setTimeout(() => {{ observer.disconnect(); reject(new Error(
            "timed out after {timeout} s waiting for: " + {json.dumps(condition)})); }}, {int(timeout * 1000)});
          const observer = new MutationObserver(() => {{
            const value = check();
            if (value) {{ observer.disconnect(); clearTimeout(timer); resolve(value); }}
          }});
          observer.observe(document, {{subtree: true, childList: true, attributes: true, characterData: true}});
        }})"""
        return await self.evaluate(script, timeout=timeout)

    async def screenshot(self, path: Path) -> Path:
        data = await self.send("Page.captureScreenshot", format="png")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    async def close(self) -> None:
        await self.ws.close()
        await self._reader
