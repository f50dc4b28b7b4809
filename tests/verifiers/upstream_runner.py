"""verifiers' own eval runner (``verifiers.v1.cli.eval.runner.run_eval``, what ``vf-eval``
runs), in this process, against a model at ``base_url``: the oracle of the differential tests.

Everything of upstream runs unchanged (its ``Env``, ``Rollout``, interception server on
127.0.0.1, ``null`` harness and the chat program that harness launches as a subprocess, its
scoring) but one step: ``Runtime.prepare_uv_script`` would have ``uv`` resolve the chat
program's dependencies from the package index. Here the program's file is written where that
step writes it and its interpreter is this venv's (which has those dependencies), as the
step records it once ``uv`` is done; so no packet leaves loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import pathlib
import signal
import sys
from typing import Any

import pytest


def offline_chat_program(monkeypatch: pytest.MonkeyPatch, cache: pathlib.Path) -> None:
    """Upstream's subprocess runtime with its workspaces under ``cache`` and the chat
    program prepared, run by this interpreter."""
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes import subprocess as runtime

    scripts = cache / "scripts"
    scripts.mkdir(parents=True)
    monkeypatch.setattr(runtime, "CACHE_DIR", cache)
    monkeypatch.setattr(runtime.SubprocessRuntime, "scripts_dir", str(scripts))
    path = scripts / f"{hashlib.sha256(CHAT_PROGRAM_SOURCE.encode()).hexdigest()}.py"
    path.write_text(CHAT_PROGRAM_SOURCE)
    monkeypatch.setitem(runtime.SubprocessRuntime._interpreters, str(path), sys.executable)
    monkeypatch.setattr(runtime.asyncio, "create_subprocess_exec", _tracked(asyncio.create_subprocess_exec))


# Upstream's subprocess runtime signals its programs at the end without waiting for them, so a
# program can outlive run_eval's loop: its pipes are then closed by the garbage collector, whose
# ResourceWarning (an error under this suite's filterwarnings) lands in whatever test runs then.
# Every process it starts is kept here and reaped before run_upstream_eval returns.
_STARTED: list[asyncio.subprocess.Process] = []


def _tracked(create: Any) -> Any:
    async def create_and_keep(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        process = await create(*args, **kwargs)
        _STARTED.append(process)
        return process

    return create_and_keep


async def _reap_started() -> None:
    while _STARTED:
        process = _STARTED.pop()
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await asyncio.wait_for(process.wait(), 30)


async def run_upstream_eval(taskset_id: str, base_url: str, out: pathlib.Path, harness: str = "null") -> list[Any]:
    """One episode per task of ``taskset_id``, through upstream's eval runner with the
    ``harness`` of that id (``null``: one chat, the task's tools; a program-harness taskset's
    own id: the harness it exports), at temperature 0; its traces by row idx."""
    from verifiers.v1.cli.eval.runner import run_eval
    from verifiers.v1.configs.cli.eval import EvalConfig

    config = EvalConfig.model_validate(
        {
            "env": {
                "taskset": {"id": taskset_id},
                "agent": {"harness": {"id": harness}, "runtime": {"type": "subprocess"}},
            },
            "model": "simulated",
            "client": {"base_url": base_url, "api_key_var": "SIMULATED_API_KEY"},
            "sampling": {"temperature": 0},
            "push": False,
            "rich": None,
            "output_dir": str(out),
        }
    )
    _STARTED.clear()  # only what upstream starts in this loop (ours ran in another)
    try:
        episodes = await run_eval(config)
    finally:
        await _reap_started()
    return sorted((t for e in episodes for t in e.traces), key=lambda t: t.task.data.idx or 0)
