"""The viewer's HTTP server: the static page and a JSON API over run directories.

Routes (all GET; ``run`` is a run id from ``/api/runs``, ``id`` a rollout id)::

    /                         the page (static/index.html; static/app.js, static/style.css)
    /api/runs                 the runs: id, path, run_id, created, taskset, model, rollouts
                              (model: ``{"name", "served"}``, where it is served)
    /api/run?run=             one run: manifest config, its model, counts, filter values, columns
    /api/rollouts?run=&...    a page of rollouts: sort, order, offset, limit and the filters
                              reward_min, reward_max, ok, stop, error, task, group
    /api/rollout?run=&id=     one rollout, decoded from its trace
    /api/siblings?run=&id=    its group: reward, ok and advantage of each sample
    /api/plot.png?run=        the report's plot of the run, rendered on demand
    /api/live?run=            a live run's status, from its status.json (``live``)

Index builds, trace reads and plots run in worker threads, so the event loop stays free.
Bound to loopback, the server answers only requests whose ``Host`` is a loopback name: a
web page elsewhere cannot read traces through DNS rebinding.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
from aiohttp import web

from .._errors import CorruptRun, SchemaMismatch
from .._record.store import read_manifest
from .._record.tokens import has_tokens
from .catalog import NotARunDirectory, RunEntry, describe, find_runs, model_shown
from .detail import read_trace, siblings, trace_view
from .index import RunIndex, build_index
from .live_status import live_status
from .table_query import BadQuery, Query, overview, page, select

STATIC_DIR = Path(__file__).parent / "static"
PlotFn = Callable[[pa.Table, str], object]
TokenizerFn = Callable[[Any], Callable[[int], str] | None]
"""``tokenizer(model)``: the text of each token id of the run whose manifest records ``model``
(``None``: not known here)."""
"""``plot(samples, png_path)``, as ``rollout-ray report`` draws it."""

MAX_LIMIT = 500
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
_PAGE_HEADERS = {
    # Defence in depth: the page renders model output, and never runs or loads anything else.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


class NotFound(LookupError):
    """An unknown run or rollout id."""


class Viewer:
    """The runs behind one server, and what it caches of them."""

    def __init__(
        self, paths: Sequence[str | os.PathLike[str]], plot: PlotFn | None = None, tokenizer: TokenizerFn | None = None
    ) -> None:
        """Find the runs of ``paths`` now. Raises ``NotARunDirectory`` for a path without runs.

        ``tokenizer(model)``: for a run's manifest model, the text of a token id, or ``None``
        where that model's tokenizer is not at hand (the token view then shows ids)."""
        self.paths = [Path(p) for p in paths]
        self.runs = find_runs(self.paths)
        self.plot = plot
        self.tokenizer = tokenizer
        self._indexes: dict[str, RunIndex] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._selections: OrderedDict[tuple[Any, ...], pa.Array] = OrderedDict()
        self._plots: dict[tuple[Any, ...], bytes] = {}
        self._plot_lock = threading.Lock()  # pyplot is not thread-safe

    def entry(self, run_id: str | None) -> RunEntry:
        if run_id not in self.runs:
            self.rescan()  # a run started after the server
        if run_id is None or run_id not in self.runs:
            raise NotFound(f"no run {run_id!r}")
        return self.runs[run_id]

    def rescan(self) -> None:
        with contextlib.suppress(NotARunDirectory):  # a directory went away: keep what was found
            self.runs = find_runs(self.paths)

    async def index(self, run_id: str) -> RunIndex:
        """The run's index, rebuilt only when its shards changed (see ``index``)."""
        entry = self.entry(run_id)
        lock = self._locks.setdefault(run_id, asyncio.Lock())
        async with lock:
            current = await asyncio.to_thread(build_index, entry.layout, self._indexes.get(run_id))
            self._indexes[run_id] = current
            return current

    async def selection(self, run_id: str, query: Query) -> tuple[RunIndex, pa.Array]:
        """The matching rows in order; the last few queries are kept, so paging is a slice."""
        index = await self.index(run_id)
        key = (run_id, index.keys, query.key())
        if key in self._selections:
            self._selections.move_to_end(key)
        else:
            self._selections[key] = await asyncio.to_thread(select, index, query)
            while len(self._selections) > 16:
                self._selections.popitem(last=False)
        return index, self._selections[key]

    async def plot_png(self, run_id: str) -> bytes:
        if self.plot is None:
            raise NotFound("this server draws no plots")
        index = await self.index(run_id)
        key = (run_id, index.keys)
        if key not in self._plots:
            scored = index.table.filter(pc.is_finite(index.table["reward"]))
            if not scored.num_rows:
                raise NotFound(f"run {run_id!r} has no scored rollouts to plot")
            self._plots = {key: await asyncio.to_thread(self._render, scored)}  # the latest only
        return self._plots[key]

    def _render(self, table: pa.Table) -> bytes:
        assert self.plot is not None
        with self._plot_lock, tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "plot.png")
            self.plot(table, path)
            return Path(path).read_bytes()


def _json(data: Any, status: int = 200) -> web.Response:
    # msgspec writes NaN and infinity as null, which JSON.parse accepts.
    return web.Response(
        body=msgspec.json.encode(data),
        status=status,
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


def _int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name, "").strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        raise BadQuery(f"{name} must be an integer, got {raw!r}") from None
    return min(max(value, low), high)


def create_app(viewer: Viewer, *, loopback_only: bool = True) -> web.Application:
    """The aiohttp application of ``viewer``; ``loopback_only`` checks the ``Host`` header."""
    app = web.Application(middlewares=[_errors_middleware(loopback_only)])
    app.router.add_get("/", _page)
    app.router.add_static("/static/", STATIC_DIR, follow_symlinks=False)
    handlers = _Handlers(viewer)
    app.router.add_get("/api/runs", handlers.runs)
    app.router.add_get("/api/run", handlers.run)
    app.router.add_get("/api/rollouts", handlers.rollouts)
    app.router.add_get("/api/rollout", handlers.rollout)
    app.router.add_get("/api/siblings", handlers.siblings)
    app.router.add_get("/api/plot.png", handlers.plot)
    app.router.add_get("/api/live", handlers.live)
    return app


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _errors_middleware(loopback_only: bool) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if loopback_only and request.url.host not in _LOOPBACK:
            return _json({"error": f"host {request.host!r} refused: the viewer answers loopback only"}, 403)
        try:
            return await handler(request)
        except BadQuery as exc:
            return _json({"error": str(exc)}, 400)
        except (NotFound, FileNotFoundError) as exc:
            return _json({"error": str(exc)}, 404)
        except (CorruptRun, SchemaMismatch, ValueError) as exc:  # a damaged run or manifest
            return _json({"error": str(exc)}, 500)

    return middleware


async def _page(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers=_PAGE_HEADERS)


class _Handlers:
    def __init__(self, viewer: Viewer) -> None:
        self.viewer = viewer

    async def runs(self, request: web.Request) -> web.Response:
        self.viewer.rescan()
        entries = list(self.viewer.runs.values())
        return _json({"runs": await asyncio.to_thread(lambda: [describe(e) for e in entries])})

    async def run(self, request: web.Request) -> web.Response:
        run_id = request.query.get("run")
        entry = self.viewer.entry(run_id)
        index = await self.viewer.index(entry.id)
        manifest = await asyncio.to_thread(read_manifest, entry.layout)
        return _json(
            {
                "id": entry.id,
                "path": str(entry.path),
                "run_id": manifest.run_id,
                "created": manifest.created,
                "config": manifest.config,
                "model": model_shown(manifest.config.get("model")),
                "plots": self.viewer.plot is not None,
                **overview(index),
            }
        )

    async def rollouts(self, request: web.Request) -> web.Response:
        query = Query.from_params(request.query)
        offset = _int(request, "offset", 0, 0, 2**62)
        limit = _int(request, "limit", 50, 1, MAX_LIMIT)
        index, positions = await self.viewer.selection(self.viewer.entry(request.query.get("run")).id, query)
        rows = page(index, positions, offset, limit)
        return _json(
            {"total": index.table.num_rows, "matched": len(positions), "offset": offset, "limit": limit, "rows": rows}
        )

    async def _locate(self, request: web.Request) -> tuple[RunEntry, RunIndex, int]:
        entry = self.viewer.entry(request.query.get("run"))
        index = await self.viewer.index(entry.id)
        rollout_id = request.query.get("id", "")
        position = index.locate(rollout_id)
        if position is None:
            raise NotFound(f"no rollout {rollout_id!r} in run {entry.id!r}")
        return entry, index, position

    async def rollout(self, request: web.Request) -> web.Response:
        entry, index, position = await self._locate(request)
        trace = await asyncio.to_thread(read_trace, index, position)
        row = index.table.slice(position, 1).to_pylist()[0]
        keep = ("run_id", "group_id", "sample_idx", "attempt")
        text = None
        if self.viewer.tokenizer is not None and has_tokens(trace):
            manifest = await asyncio.to_thread(read_manifest, entry.layout)
            text = self.viewer.tokenizer(manifest.config.get("model"))
        return _json({"run": entry.id, **{k: row[k] for k in keep}, **trace_view(trace, token_text=text)})

    async def siblings(self, request: web.Request) -> web.Response:
        entry, index, position = await self._locate(request)
        manifest = await asyncio.to_thread(read_manifest, entry.layout)
        recorded = manifest.config.get("eval", {}).get("finalize")
        return _json(await asyncio.to_thread(siblings, index, position, recorded))

    async def live(self, request: web.Request) -> web.Response:
        """A live run's status (``live``)."""
        entry = self.viewer.entry(request.query.get("run"))
        return _json(await asyncio.to_thread(live_status, entry.layout))

    async def plot(self, request: web.Request) -> web.Response:
        png = await self.viewer.plot_png(self.viewer.entry(request.query.get("run")).id)
        return web.Response(body=png, content_type="image/png", headers={"Cache-Control": "no-store"})


async def start(viewer: Viewer, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve ``viewer`` on ``host:port`` (0: a free port); return the runner and the page's URL."""
    loopback = host in _LOOPBACK or host.startswith("127.")
    runner = web.AppRunner(create_app(viewer, loopback_only=loopback), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0]
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    return runner, f"http://{shown}:{bound[1]}/"
