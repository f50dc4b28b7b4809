"""``rollout-ray view``: browse run directories in a local web page."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable


def add_view_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run_dirs",
        nargs="*",
        metavar="RUN_DIR",
        default=["runs"],
        help="run directories, or directories of runs (default: runs/)",
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback)")
    p.add_argument("--port", type=int, default=8765, help="port (0 picks a free one; default 8765)")
    p.set_defaults(run=_view)


def run_tokenizer(model: object) -> Callable[[int], str] | None:
    """The text of a token id for a run whose manifest records ``model``: the simulated
    model's tokenizer for a run on it (``{"simulated": config}``, as eval and sweep record it);
    ``None`` for a served model, whose tokenizer the viewer does not fetch."""
    if isinstance(model, dict) and isinstance(model.get("simulated"), dict):
        from .._simulated.tokenizer import token_text

        return token_text
    return None


def _view(args: argparse.Namespace) -> int:
    # Imported here, so the other commands start without the viewer's server.
    from .._viewer.catalog import NotARunDirectory
    from .._viewer.server import Viewer, start
    from .extras import installed
    from .interrupt import Stop, serve_until_signal
    from .summary import plot

    try:
        viewer = Viewer(args.run_dirs, plot=plot if installed("matplotlib") else None, tokenizer=run_tokenizer)
    except NotARunDirectory as exc:
        print(f"rollout-ray view: {exc}", file=sys.stderr)
        return 2
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"rollout-ray view: serving on {args.host}: anyone who reaches it reads every trace "
            "(there is no authentication)",
            file=sys.stderr,
        )

    def announce(url: str) -> None:
        print(f"viewing {len(viewer.runs)} run(s) at {url}  (Ctrl-C stops)", flush=True)

    async def serving() -> tuple[str, Stop]:
        runner, url = await start(viewer, args.host, args.port)
        return url, runner.cleanup

    try:
        asyncio.run(serve_until_signal(serving, announce))
    except OSError as exc:  # the port is taken, or the host is not ours
        print(f"rollout-ray view: cannot serve on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0
