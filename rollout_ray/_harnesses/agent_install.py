"""Installs an agent program once per node, the way its users install it, pinned.

``npm_install("@openai/codex", "0.169.0", "codex")`` runs ``npm install`` of that exact version;
``pip_install("mini-swe-agent==2.4.6")`` runs ``pip install --target``. Each goes to a directory
of its own under ``agents_dir()``, made in a scratch directory and renamed into place when
complete, under a file lock: concurrent rollouts on a node (and concurrent nodes' processes on
one machine) install once, the others wait and reuse it, and a half-done install is never used.

Where: ``ROLLOUT_RAY_AGENTS`` if set, else ``rollout_ray_agents`` beside the running
environment's packages (its ``purelib``). That default is what a ``SandboxRuntime`` shows
read-only at the same path, so the installed program runs inside the sandbox unchanged; with
``ROLLOUT_RAY_AGENTS`` elsewhere only a ``LocalRuntime`` sees it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .._errors import HarnessError

INSTALL_TIMEOUT = 900.0
"""Seconds an install may take (Claude Code's native binary is ~200 MB); the environment's
``ROLLOUT_RAY_AGENT_INSTALL_TIMEOUT`` overrides it."""


def _install_timeout() -> float:
    return float(os.environ.get("ROLLOUT_RAY_AGENT_INSTALL_TIMEOUT") or INSTALL_TIMEOUT)


def agents_dir() -> Path:
    """Where agents are installed on this node (see the module docstring)."""
    given = os.environ.get("ROLLOUT_RAY_AGENTS")
    return Path(given) if given else Path(sysconfig.get_paths()["purelib"]) / "rollout_ray_agents"


def _installed(name: str, command: Sequence[str], what: str) -> Path:
    """``agents_dir()/name``, made by ``command`` (``{dir}`` replaced) unless it exists."""
    root = agents_dir()
    final = root / name
    if final.is_dir():
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f".{name}.lock", "w")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        raise HarnessError(
            f"cannot install {what} into {root}: {exc}; set ROLLOUT_RAY_AGENTS to a writable "
            "directory (only a LocalRuntime sees one outside the environment)"
        ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held by one installer; the others wait, then reuse
        if final.is_dir():
            return final
        work = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}-"))
        try:
            argv = [a.replace("{dir}", str(work)) for a in command]
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=_install_timeout())  # noqa: S603 - argv is the preset's own install command
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise HarnessError(f"cannot install {what}: {exc}; install it by hand into {final}") from None
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip()[-600:]
                raise HarnessError(f"cannot install {what} ({argv[0]} exited {done.returncode}): {tail}")
            work.chmod(0o755)  # mkdtemp's 0700 would hide it from a sandbox's unprivileged uid
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def npm_missing(package: str, version: str) -> str | None:
    """``npm package@version`` while this node has not installed it, else None."""
    found = (agents_dir() / f"{package.replace('/', '+')}@{version}").is_dir()
    return None if found else f"npm {package}@{version}"


def pip_missing(requirement: str) -> str | None:
    """``pip requirement`` while this node has not installed it, else None."""
    found = (agents_dir() / requirement.replace("==", "@").replace("/", "+")).is_dir()
    return None if found else f"pip {requirement}"


def npm_install(package: str, version: str, binary: str) -> Path:
    """The path of ``binary`` of ``package@version`` from the npm registry, installed if needed.

    Raises:
        HarnessError: no ``npm`` on this node, or the install failed (its output's tail).
    """
    if shutil.which("npm") is None:
        raise HarnessError(f"cannot install {package}@{version}: no npm on this node; install Node.js and npm")
    name = f"{package.replace('/', '+')}@{version}"
    command = ["npm", "install", "--no-audit", "--no-fund", "--prefix", "{dir}", f"{package}@{version}"]
    return _installed(name, command, f"{package}@{version}") / "node_modules" / ".bin" / binary


def pip_install(requirement: str) -> Path:
    """The directory holding ``requirement`` (``name==version``) and its dependencies from the
    package index (``pip install --target``), installed if needed: put it on ``PYTHONPATH``.

    Raises:
        HarnessError: the install failed (its output's tail).
    """
    name = requirement.replace("==", "@").replace("/", "+")
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--target",
        "{dir}",
        requirement,
    ]
    return _installed(name, command, requirement)
