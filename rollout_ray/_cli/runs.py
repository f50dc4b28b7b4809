"""Where eval's run goes and how it comes back: the latest run to resume, the command that
continues an interrupted one, and the model a server serves."""

from __future__ import annotations

import json
import os
import shlex
import urllib.error
import urllib.request

from .._errors import CorruptRun, UsageError
from .._record.run_layout import RunLayout
from .._record.store import read_manifest

RUNS_ROOT = "runs"


def latest_run(taskset: str, root: str = RUNS_ROOT) -> str:
    """The run directory under ``root`` of ``taskset`` made last (for ``--resume`` without ``--out``).

    Raises:
        UsageError: there is none; the message lists the runs that are there.
    """
    runs = []
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    for name in names:
        path = os.path.join(root, name)
        if not RunLayout.of(path).holds_run():
            continue
        try:
            manifest = read_manifest(path)
        except CorruptRun:
            continue
        runs.append((manifest.created, name, manifest.config.get("taskset")))
    mine = sorted((created, name) for created, name, ref in runs if ref == taskset)
    if mine:
        return os.path.join(root, mine[-1][1])
    there = ", ".join(f"{name} ({ref})" for _, name, ref in sorted(runs)[-5:]) or "none"
    raise UsageError(
        f"--resume without --out: no run of {taskset} under {root}/ (runs there: {there}); pass --out RUN_DIR"
    )


def continue_command(argv: list[str], out: str) -> str:
    """The command line (eval's or sweep's) that resumes ``argv``'s run in ``out``."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--out":
            skip = True
        elif not (arg in ("--resume", "--overwrite") or arg.startswith("--out=")):
            kept.append(arg)
    return shlex.join(["rollout-ray", *kept, "--resume", "--out", out])


def served_model(url: str, api_key: str | None, timeout: float = 10.0) -> str:
    """The one model the server at ``url`` serves (its ``/models``), for ``--model-url`` without ``--model``.

    Raises:
        UsageError: the server is unreachable, cannot list its models, or serves none or
            several (they are listed).
    """
    request = urllib.request.Request(  # noqa: S310 - the model server's http(s) URL the user passed
        url.rstrip("/") + "/models",
        headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the request built above
            ids = [m["id"] for m in json.load(response)["data"]]
    except urllib.error.HTTPError as e:  # it answers, but not with its models: naming one is the way
        raise UsageError(
            f"--model-url {url}: cannot list its models (GET /models: HTTP {e.code} {e.reason}); pass --model NAME"
        ) from None
    except (urllib.error.URLError, OSError) as e:  # nothing answers: a name would not help
        reason = getattr(e, "reason", None) or e
        raise UsageError(
            f"--model-url {url}: the server is unreachable ({reason}); start it, or check the URL"
        ) from None
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(
            f"--model-url {url}: cannot list its models (GET /models is not an OpenAI model list: "
            f"{type(e).__name__}: {e}); pass --model NAME"
        ) from None
    if len(ids) != 1:
        listed = ", ".join(ids) if ids else "none"
        raise UsageError(f"--model-url {url} serves {len(ids)} models ({listed}); pass --model NAME")
    return str(ids[0])
