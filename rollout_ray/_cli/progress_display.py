"""eval's progress: a live bar in a terminal (tqdm), a plain line every few seconds otherwise
(and in a terminal too when tqdm, of the ``[cli]`` extra, is not installed).

``wall`` is the command's clock, the one eval's summary ends with (``started``): not the
driver's, which starts after Ray. Rate and ETA count from the first finished rollout, not
from the start: what comes before it (Ray, actors, the first model answer) is warm-up, and
charging it to the rate made the first ETA of a 6 s run read 697 s. Until the first rollout
has finished, the line reads "warming up"; after it, until a later finishing gives a rate,
"measuring rate". A finished run's last line reads "finished", with no rate: a rate counted
from the first finished rollout is not the summary's (over the driver's whole run), and a last
line of 13.7 rollouts/s above a summary of 1.8 told the user two numbers for one thing. The
running mean reward and failures are the driver's (``Progress.mean_reward``): each rollout's kept outcome, the one stored, a
failed rollout as reward 0, as in the summary. They are not the attempts': with
``--retry-failed`` a failed attempt run again is not counted, and averaging attempts made the
bar read 0.490 where the summary said 0.5556.

Cost: the driver calls the display at most every 0.5 s and counts each rollout with a few
additions, so the display costs nothing that grows with the rollouts.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from typing import Any, TextIO

from .._driver.driver import Progress
from .extras import installed

PLAIN_EVERY = 5.0
"""Seconds between plain progress lines (not a terminal)."""


class ProgressDisplay:
    """Shows ``Progress`` on ``stream``: ``update`` as the driver reports, ``close`` at the end.

    Args:
        stream: where to write (a terminal gets a live bar).
        clock: seconds, monotonic (a test passes a fake one).
        tty: a live bar (if tqdm is installed); default: ``stream.isatty()``.
        started: where ``wall`` counts from, on ``clock`` (default: now).
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        clock: Callable[[], float] = time.monotonic,
        tty: bool | None = None,
        started: float | None = None,
    ) -> None:
        self.stream, self.clock = stream, clock
        self.tty = (stream.isatty() if tty is None else tty) and installed("tqdm")
        self.started = clock() if started is None else started
        self._first: tuple[float, int] | None = None  # (when, done) at the first finished rollout
        self._last_line = -PLAIN_EVERY
        self._held: dict[str, Any] | None = None  # the latest counts not yet written (plain mode)
        self._bar: Any = None

    def rate(self, done: int) -> float | None:
        """Rollouts per second since the first finished one; None while warming up."""
        if self._first is None:
            return None
        when, at = self._first
        elapsed = self.clock() - when
        return (done - at) / elapsed if done > at and elapsed > 0 else None

    def fields(self, p: Progress) -> dict[str, Any]:
        """What a line shows: counts, the running mean reward, the wall clock, rate and ETA."""
        now = self.clock()
        if self._first is None and p.done > 0:
            self._first = (now, p.done)
        total = None if p.total is None else p.total - p.skipped
        rate = self.rate(p.done)
        eta = None if total is None or not rate else max(total - p.done, 0) / rate
        return {
            "done": p.done,
            "total": total,
            "failed": p.failed,
            "in_flight": p.in_flight,
            "mean_reward": p.mean_reward,
            "wall": now - self.started,
            "rate": rate,
            "eta": eta,
            "target": p.target,
            "target_why": p.target_why,
        }

    def update(self, p: Progress) -> None:
        f = self.fields(p)
        if self.tty:
            self._show_bar(f)
        elif f["wall"] - self._last_line >= PLAIN_EVERY or (f["total"] is not None and f["done"] >= f["total"]):
            self._write_plain(f)
        else:
            self._held = f

    def _write_plain(self, f: dict[str, Any]) -> None:
        self._last_line, self._held = f["wall"], None
        self.stream.write(plain_line(f) + "\n")
        self.stream.flush()

    def close(self) -> None:
        # A run with no known total (max_groups) never reaches "done >= total": its last
        # counts, held back by the line rate, are written here so the log ends on them.
        if self._held is not None:
            self._write_plain(self._held)
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _show_bar(self, f: dict[str, Any]) -> None:
        from tqdm import tqdm

        if self._bar is None:
            # A terminal that reports no size (some ptys) would get no bar: assume 100 x 24.
            width = {} if _columns(self.stream) else {"ncols": 100, "nrows": 24}
            self._bar = tqdm(
                total=f["total"],
                file=self.stream,
                unit="rollout",
                dynamic_ncols=not width,
                **width,
                bar_format="{desc}{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}{postfix}",
                mininterval=0,
            )
        self._bar.n = f["done"]
        self._bar.set_postfix_str(_postfix(f), refresh=False)
        self._bar.refresh()


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return 0


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds}s"


def _pace(f: dict[str, Any], unit: str) -> str:
    """Rate and ETA, or why there are none yet (or any more)."""
    if f["total"] is not None and f["done"] >= f["total"]:
        return "finished"
    if f["rate"] is None:
        return "measuring rate" if f["done"] else "warming up"
    return f"{f['rate']:.1f}{unit} ETA {_duration(f['eta'] or 0)}"


def _postfix(f: dict[str, Any]) -> str:
    mean = "-" if f["mean_reward"] is None else f"{f['mean_reward']:.3f}"
    rate = _pace(f, "/s")
    target = "" if f.get("target") is None else f"  target {f['target']} ({f['target_why']})"
    return f"failed {f['failed']}{target}  reward {mean}  [wall {_duration(f['wall'])}, {rate}]"


def plain_line(f: dict[str, Any]) -> str:
    """One progress line for a log: ``done 12/40  failed 0  in flight 8  reward 0.917  ...``."""
    total = "" if f["total"] is None else f"/{f['total']}"
    mean = "-" if f["mean_reward"] is None else f"{f['mean_reward']:.3f}"
    rate = _pace(f, " rollouts/s ")
    target = "" if f.get("target") is None else f"/{f['target']} ({f['target_why']})"
    return (
        f"done {f['done']}{total}  failed {f['failed']}  in flight {f['in_flight']}{target}  reward {mean}  "
        f"wall {_duration(f['wall'])}  {rate}"
    )
