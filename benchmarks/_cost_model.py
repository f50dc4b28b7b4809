"""bench_cost.py's model server: the built-in ``SimulatedModelServer`` in its own process, which
also says when its first chat request arrived and how many were in flight at once.

    python benchmarks/_cost_model.py --ttft 0.09        # prints "serving at http://127.0.0.1:PORT/v1"

Extra routes, for the benchmark only (never called while a row is measured):

- ``GET /bench/stats``: ``{"first": t, "last": t, "requests": n, "peak_in_flight": k,
  "in_flight": k}`` since the last reset (``t``: ``time.time()`` of the machine, so another
  process can compare it with its own clock; ``null`` before the first request);
- ``POST /bench/reset``: zero them.

The socket's listen backlog is 8,192 (aiohttp's default of 128 drops SYNs when thousands of
clients connect at once, which would show up as seconds of TCP retransmission, not as model
latency). Everything else is exactly the simulated model of ``rollout-ray serve-model``.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import signal
import time

from aiohttp import web

from rollout_ray import SimulatedModelServer
from rollout_ray._simulated.config import SimulatedModelConfig


class BenchModelServer(SimulatedModelServer):
    def __init__(self, config: SimulatedModelConfig) -> None:
        super().__init__(config)
        self._reset()

    def _reset(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.requests = 0
        self.in_flight = 0
        self.peak_in_flight = 0

    async def _chat(self, request: web.Request) -> web.StreamResponse:  # the chat route's handler
        now = time.time()
        if self.first is None:
            self.first = now
        self.last = now
        self.requests += 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await super()._chat(request)
        finally:
            self.in_flight -= 1

    async def _bench_stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "first": self.first,
                "last": self.last,
                "requests": self.requests,
                "peak_in_flight": self.peak_in_flight,
                "in_flight": self.in_flight,
            }
        )

    async def _bench_reset(self, request: web.Request) -> web.Response:
        self._reset()
        self.peak_in_flight = self.in_flight
        return web.json_response({"ok": True})

    def _app(self) -> web.Application:
        app = super()._app()
        app.router.add_get("/bench/stats", self._bench_stats)
        app.router.add_post("/bench/reset", self._bench_reset)
        return app


async def serve(ttft: float, host: str, port: int, backlog: int) -> None:
    server = BenchModelServer(SimulatedModelConfig(ttft=ttft))
    runner = web.AppRunner(server._app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=backlog).start()
    bound = runner.addresses[0][1]
    print(f"serving at http://{host}:{bound}/v1", flush=True)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    await done.wait()
    stopping = getattr(server, "_stopping", None)
    if stopping is not None:
        stopping.set()  # release held requests
    await runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ttft", type=float, default=0.09)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--backlog", type=int, default=8192)
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(serve(args.ttft, args.host, args.port, args.backlog))


if __name__ == "__main__":
    main()
