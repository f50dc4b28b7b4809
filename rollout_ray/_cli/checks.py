"""eval's checks of what the parser cannot see, made before anything starts (no model server,
no Ray, no file written): each mistake is one line. An error where the setting can only be a
mistake (``UsageError``), a warning on stderr where it may be meant."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from .._core.sampling import unknown_sampling
from .._driver.driver import EvalConfig
from .._errors import CorruptRun, ResumeMismatch, RunInUse, UsageError
from .._record.manifest import RunLock
from .._record.run_layout import MANIFEST, RunLayout


def warn(message: str) -> None:
    print(f"rollout-ray eval: warning: {message}", file=sys.stderr)


def check_out(out: str, *, resume: bool, overwrite: bool) -> None:
    """``--out`` can hold this run: a directory (or one to make), not a link, and not a run
    unless ``resume`` continues it or ``overwrite`` replaces it (only a run directory)."""
    if resume and overwrite:
        raise UsageError("--resume and --overwrite exclude each other: continue the run in --out, or replace it")
    path = os.path.normpath(out)
    if os.path.lexists(path) and not os.path.isdir(path):
        what = "a file" if os.path.isfile(path) else "not a directory"
        raise UsageError(f"--out {out} is {what}; choose a directory")
    ancestor = path
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor) or "."
    if not os.path.isdir(ancestor):
        raise UsageError(f"--out {out}: {ancestor} is a file, not a directory; choose another --out")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out}: cannot write in {ancestor} (permission denied); choose another --out")
    if os.path.islink(path):
        raise UsageError(
            f"--out {out} is a symbolic link; a run directory is never reached through one: pass the directory itself"
        )
    holds_run = RunLayout.of(path).holds_run()
    if overwrite:
        if not holds_run and os.path.isdir(path) and os.listdir(path):
            raise UsageError(
                f"--overwrite: {out} is not a run directory (no {MANIFEST}); "
                "nothing there is replaced: choose another --out"
            )
    elif holds_run and not resume:
        raise UsageError(f"--out {out} already holds a run; pass --resume to continue it, or --overwrite to replace it")
    if holds_run:
        lock = RunLock(path)
        try:
            lock.acquire()
        except (RunInUse, CorruptRun) as e:
            raise UsageError(str(e)) from None
        lock.release()


def check_api_key(variable: str | None, *, model_url: str | None) -> None:
    """An ``--api-key-env`` given names a variable that is set, and a server that uses it."""
    if variable is None:
        return
    if not model_url:
        warn(f"--api-key-env {variable} is not used: the built-in simulated model needs no key (pass --model-url)")
    elif not os.environ.get(variable):
        raise UsageError(
            f"--api-key-env {variable}: {variable} is not set; export it, or leave --api-key-env "
            "out for a server that needs no key"
        )


def check_pass_k(config: EvalConfig, *, given: bool) -> None:
    """Every pass@k can be computed from the samples of a task (k <= n): a larger k is a column
    of nulls. An error for ``--pass-k`` (``given``), a warning for the taskset's own."""
    n = config.samples_per_task
    over = [k for k in config.finalize.pass_k if k > n]
    if not over:
        return
    ks = ",".join(map(str, over))
    if given:
        raise UsageError(
            f"--pass-k {ks}: pass@k needs at least k samples per task, and there are {n} "
            f"(--samples); lower --pass-k or raise --samples to {max(over)}"
        )
    warn(
        f"the taskset's pass_k {ks} exceeds the {n} samples per task: pass_at_{max(over)} is empty; "
        f"pass --samples {max(over)}"
    )


def check_sampling(sampling: Mapping[str, Any] | None) -> None:
    """``--sampling`` keys: a misspelt known field is an error; a key like none of them may be
    a server's own extension, so it is sent as is, with a warning."""
    for key, known in unknown_sampling(sampling or {}):
        if known is not None:
            raise UsageError(f"--sampling: unknown key {key!r}; did you mean {known!r}?")
        warn(f"--sampling: {key!r} is not a known sampling parameter; it is sent upstream as is")


def check_address(executor: str, address: str | None) -> None:
    """With Ray, something answers at the cluster's address (``--address``, else
    ``RAY_ADDRESS``). Raises ``RayUnreachable``."""
    address = address or os.environ.get("RAY_ADDRESS")
    if executor != "ray" or not address:
        return
    from .._ray.head import check_reachable

    check_reachable(address)


def check_resume(out: str, planned: dict[str, Any]) -> None:
    """A resume of the run in ``out`` keeps the settings it was run with: ``planned`` is what
    the driver will record (taskset, model, eval). One line naming each that differs, with
    its stored and given values, before Ray starts (the driver checks again as it opens the run)."""
    from .._driver.run_dir import check_settings
    from .._record.store import read_manifest

    if not RunLayout.of(out).holds_run():
        return
    try:
        check_settings(out, read_manifest(out).config, planned)
    except (ResumeMismatch, CorruptRun) as e:
        raise UsageError(str(e)) from None
