"""``rollout-ray ctl RUN_DIR COMMAND``: see and steer a live run through its driver's control
endpoint (``_driver/control``), found with its token in the run directory's ``control.json``.

    status [--stall-after S] [--json]   rollouts in flight by phase, the stalled ones, the rate
    cancel ROLLOUT | requeue ROLLOUT    ROLLOUT: a rollout id or a label (<group>#<sample>)
    set max-in-flight N
    pause | resume | stop
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import urllib.error
import urllib.request
from typing import Any

from .._errors import CorruptRun, UsageError
from .._record.run_layout import CONTROL, STATUS, RunLayout
from .arguments import in_flight_bound, number

TIMEOUT = 30.0
"""Seconds the driver has to answer (a status polls every rollout actor, within 5 s)."""


def add_ctl_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory of a running eval or driver")
    sub = p.add_subparsers(dest="action", required=True, metavar="COMMAND")
    status = sub.add_parser("status", help="rollouts in flight by phase, the stalled ones, the rate, the model servers")
    status.add_argument(
        "--stall-after",
        metavar="S",
        type=number(minimum=0),
        help="count a rollout stalled after S seconds in one phase (default: 3 x the phase's p99)",
    )
    status.add_argument("--json", action="store_true", help="the status as JSON")
    for name, what in (
        ("cancel", "fail a rollout as cancelled (retried as failures are: --retry-failed)"),
        ("requeue", "drop a rollout's attempt and run it again"),
    ):
        sub.add_parser(name, help=what).add_argument("rollout", metavar="ROLLOUT", help="its id or label, from status")
    setting = sub.add_parser("set", help="change a setting of the live run")
    setting.add_argument("setting", choices=["max-in-flight"])
    setting.add_argument(
        "value",
        metavar="N",
        type=in_flight_bound,
        help="a number, or 'auto': back to the controller of a run started with --max-in-flight auto",
    )
    sub.add_parser("pause", help="start no more rollouts (those running go on)")
    sub.add_parser("resume", help="start rollouts again")
    sub.add_parser("stop", help="start no more; what runs finishes and is stored; the run exits with its resume line")
    p.set_defaults(run=_ctl)


def _ctl(args: argparse.Namespace) -> int:
    url, token = _endpoint(args.run_dir)
    action = args.action
    if action == "status":
        query = "" if args.stall_after is None else f"?stall_after={args.stall_after}"
        status = _call(url, token, "GET", "/status" + query)
        print(json.dumps(status, indent=2) if args.json else format_status(status))
        return 0
    if action in ("cancel", "requeue"):
        answer = _call(url, token, "POST", f"/{action}", {"rollout": args.rollout})
    elif action == "set":
        answer = _call(url, token, "POST", "/max-in-flight", {"n": args.value})
    else:
        answer = _call(url, token, "POST", f"/{action}")
    print(answer["done"])
    return 0


def _endpoint(run_dir: str) -> tuple[str, str]:
    layout = RunLayout.of(run_dir)
    try:
        with layout.open() as run:  # no link followed: the token is the run's own
            info = json.loads(run.read_bytes(CONTROL))
    except FileNotFoundError:
        holder = _holder(layout)
        if holder is not None:
            raise UsageError(
                f"{run_dir}: its run (pid {holder}) has no control endpoint yet: it opens when the "
                "rollouts start, after Ray's warm-up; try again in a few seconds"
            ) from None
        state = _final_state(layout)
        raise UsageError(
            f"{run_dir}: no live run (no control.json{state}); start one with `rollout-ray eval ... --out RUN_DIR`"
        ) from None
    except (OSError, ValueError, CorruptRun) as e:
        raise UsageError(f"{run_dir}: cannot read its control.json ({e})") from None
    return info["url"], info["token"]


def _holder(layout: RunLayout) -> str | None:
    """The pid of the process holding the run's lock (eval takes it before Ray starts), or None.

    Asked with a shared lock tried and dropped at once: an eval starting in that instant is
    refused as if the run were in use, and says so; flock has no way to ask without locking."""
    try:
        fd = os.open(layout.lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
    except OSError:
        return None
    finally:
        os.close(fd)  # closing it drops a lock taken
    return None


def _final_state(layout: RunLayout) -> str:
    try:
        with layout.open() as run:
            return f"; its last status says {json.loads(run.read_bytes(STATUS))['state']}"
    except (OSError, ValueError, KeyError, CorruptRun):
        return ""


def _call(url: str, token: str, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if method == "GET" else json.dumps(body or {}).encode()
    request = urllib.request.Request(  # noqa: S310 - the control URL is the run's own http:// address (ctl.json)
        url + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:  # noqa: S310 - the request built above, to the run's http:// address
            return json.loads(response.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as e:
        try:
            error = json.loads(e.read()).get("error", e.reason)
        except ValueError:
            error = e.reason
        raise UsageError(str(error)) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise UsageError(f"the run's driver does not answer at {url} ({reason}); is it still running?") from None


def format_status(s: dict[str, Any]) -> str:
    """The status for people: the run's line, the phases, the model servers, the rollouts (stalled first)."""
    p = s["progress"]
    total = "" if p["total"] is None else f"/{p['total'] - p['skipped']}"
    lines = [
        f"{s['state']}: done {p['done']}{total}  failed {p['failed']}  in flight {p['in_flight']}  "
        f"max in flight {s['max_in_flight']}  {p['rate']:.2f} rollouts/s  stalled {s['stalled']}"
    ]
    if target := s.get("in_flight_target"):
        lines.append(f"in-flight target {target['target']} ({target['mode']}): {target['why']}")
    phases = [f"{name} {n}" for name, n in s["phases"].items() if n]
    lines.append("phases: " + ("  ".join(phases) if phases else "none in flight"))
    for server in s["servers"]:
        down = "  DOWN" if server["down"] else ""
        lines.append(f"model {server['url']}: in flight {server['in_flight']}  failing {server['failures']}{down}")
    lines.append(f"model call errors: {s['model_call_errors']}")
    rollouts = sorted(s["rollouts"], key=lambda r: (not r["stalled"], -r["age"]))
    if rollouts:
        lines.append(f"{'':8}{'rollout':34}{'label':26}{'task':>6}  {'phase':11}{'age':>8}")
    for r in rollouts:
        mark = "STALLED " if r["stalled"] else ""
        lines.append(f"{mark:8}{r['id'] or '-':34}{r['label']:26}{r['task']!s:>6}  {r['phase']:11}{r['age']:>7.1f}s")
    return "\n".join(lines)
