"""A live run's control endpoint and status file, in its run directory.

While a driver with a run directory runs, it serves a small HTTP API on loopback (a free port)
and writes ``control.json`` (its URL and a fresh token; readable by its owner only) into the
run directory: whoever can read that file may steer the run (``rollout-ray ctl``), nobody
else. Every request carries ``Authorization: Bearer <token>``; any other gets 401.

    GET  /status[?stall_after=S]      the run now (``Steering.status``)
    POST /cancel    {"rollout": REF}  fail the rollout as cancelled (404: none in flight)
    POST /requeue   {"rollout": REF}  drop its attempt and run it again
    POST /max-in-flight {"n": N}      run at most N at once from now on ("auto": the
                                      controller of a run started with max_in_flight="auto")
    POST /pause, /resume              stop / restart admitting rollouts
    POST /stop                        admit nothing more; what runs finishes, is stored, the run ends

``status.json`` (the same status) is replaced whole every ``STATUS_EVERY`` seconds for
outside monitors, and once more when the run ends (``state``: ``completed`` / ``halted``);
``control.json`` is removed then.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import os
import secrets
from pathlib import Path
from typing import Any

from aiohttp import web

from .._errors import WireError
from .._record.run_layout import RunLayout
from .._serving.http_service import HTTPService
from .steering import StallRule, Steering

log = logging.getLogger("rollout_ray")

STATUS_EVERY = 2.0
"""Seconds between two writes of ``status.json``."""
MAX_BODY = 4096
MAX_IN_FLIGHT = 1_000_000
"""The largest ``max-in-flight`` a live run accepts: far above what one driver can run at once,
low enough that a typo (``10**100``) is refused instead of silently lifting every bound."""


def write_run_file(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` (a file of the run directory) whole with ``data``, created with
    ``mode``; never through a link. Readers see the old file or the new, never a part."""
    with RunLayout.of(path.parent).open() as run:  # run_files: relative to the directory, no link
        run.write_bytes(path.name, data, mode=mode)


class ControlServer(HTTPService):
    """Serves ``steering`` for the run directory ``run_dir`` (``start`` … ``aclose``)."""

    def __init__(self, steering: Steering, run_dir: str, *, run_id: str, every: float | None = None) -> None:
        super().__init__(max_body=MAX_BODY)
        self.steering, self.layout, self.run_id = steering, RunLayout.of(run_dir), run_id
        self.every = STATUS_EVERY if every is None else every
        self.token = secrets.token_urlsafe(32)
        self._writer: asyncio.Task[None] | None = None

    def _routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/status", self._status)
        for name in ("cancel", "requeue", "max-in-flight", "pause", "resume", "stop"):
            router.add_post(f"/{name}", self._command)

    async def start(self) -> str:
        url = await super().start()
        info = {"url": url, "token": self.token, "pid": os.getpid(), "run_id": self.run_id}
        write_run_file(self.layout.control, json.dumps(info).encode(), 0o600)
        self._writer = asyncio.create_task(self._keep_status())
        return url

    async def aclose(self, state: str, reason: str = "") -> None:
        """Stop serving; write the final ``status.json`` (``state``) and remove ``control.json``."""
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
        try:
            self.layout.control.unlink(missing_ok=True)
            final = {**self.steering.final(), "state": state, "reason": reason}
            self._write_status(final)
        finally:
            await self.stop()

    async def _keep_status(self) -> None:
        while True:
            try:
                self._write_status(await self.steering.status())
            except Exception:
                log.warning("status.json: not written", exc_info=True)
            await asyncio.sleep(self.every)

    def _write_status(self, status: dict[str, Any]) -> None:
        status = {"run_id": self.run_id, "pid": os.getpid(), **status}
        write_run_file(self.layout.status, json.dumps(status).encode(), 0o644)

    def _authorized(self, request: web.Request) -> bool:
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode())

    async def _status(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _answer(401, error="wrong or missing token: use the token in the run directory's control.json")
        after = request.query.get("stall_after")
        seconds = None if after is None else _seconds(after)
        if after is not None and seconds is None:  # as the CLI's --stall-after: finite, >= 0
            return _answer(400, error=f"stall_after must be a finite number of seconds >= 0, got {after!r}")
        rule = None if seconds is None else StallRule(after=seconds)
        return _answer(200, **await self.steering.status(rule))

    async def _command(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _answer(401, error="wrong or missing token: use the token in the run directory's control.json")
        try:
            body = json.loads(await self.read_body(request) or b"{}")
        except WireError as e:
            return _answer(e.status or 400, error=str(e))
        except ValueError:
            return _answer(400, error="the body must be a JSON object")
        return _run_command(self.steering, request.path.strip("/"), body if isinstance(body, dict) else {})


def _run_command(steering: Steering, name: str, body: dict[str, Any]) -> web.Response:
    if name in ("cancel", "requeue"):
        ref = str(body.get("rollout", ""))
        if not steering.cancel(ref, "cancel" if name == "cancel" else "requeue"):
            return _answer(404, error=f"no rollout {ref!r} in flight; `rollout-ray ctl RUN_DIR status` lists them")
        return _answer(200, done=f"{name} {ref}")
    if name == "max-in-flight":
        n = body.get("n")
        if n == "auto":
            try:
                steering.set_max_in_flight(None)
            except ValueError as e:
                return _answer(409, error=str(e))
            return _answer(200, done="max-in-flight auto")
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_IN_FLIGHT:
            shown = n if not isinstance(n, int) or abs(n) < 10**18 else f"{n:.3e}"  # not 100 digits
            return _answer(
                400, error=f"max-in-flight must be an integer >= 1 and <= {MAX_IN_FLIGHT} or 'auto', got {shown!r}"
            )
        steering.set_max_in_flight(n)
        return _answer(200, done=f"max-in-flight {n}")
    if name == "pause":
        steering.slots.pause()
    elif name == "resume":
        steering.slots.resume()
    elif name == "stop":
        steering.stop()
    return _answer(200, done=name)


def _seconds(text: str) -> float | None:
    """``text`` as seconds (finite, >= 0), or None: nan, inf, 1e400 and negatives are not bounds."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _answer(status: int, **body: Any) -> web.Response:
    return web.json_response(body, status=status)
