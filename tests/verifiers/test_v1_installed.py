"""A verifiers v1 environment by its id, as users name an installed one (issue 31 §1):
``rollout-ray eval --verifiers my-env`` imports the package ``my_env`` (upstream's loader
rule) that pip installed; the package is built here from source, offline."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import zipfile

import pytest

PACKAGE = '''
"""my-env: a QA taskset and nothing of rollout_ray."""

from collections.abc import Iterator

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: int


class SumTask(vf.Task[SumData]):
    @vf.reward
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == str(task.answer))


class SumTaskset(vf.Taskset[SumTask]):
    def load(self) -> Iterator[SumTask]:
        for a in range(3):
            yield SumTask(SumData(prompt=f"What is {a} + 10?", answer=a + 10), self.config.task)


__all__ = ["SumTaskset"]
'''


def _install(tmp_path: pathlib.Path, body: str) -> pathlib.Path:
    """``my_env`` installed by pip into a directory of its own, from a wheel written here
    (a wheel is a zip: no build backend, no index)."""
    wheel = tmp_path / "my_env-0.1.0-py3-none-any.whl"
    info = "my_env-0.1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("my_env/__init__.py", body)
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: my-env\nVersion: 0.1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"my_env/__init__.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert (site / "my_env" / "__init__.py").exists()
    return site


def _eval(tmp_path: pathlib.Path, site: pathlib.Path, ref: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rollout_ray",
            "eval",
            "--verifiers",
            ref,
            "--samples",
            "4",
            "--executor",
            "local",
            "--runtime",
            "local",
            "--temperature",
            "0",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**_env(), "PYTHONPATH": str(site)},
    )


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.mark.parametrize("ref", ["my-env", "someone/my-env@0.1.0"])
def test_an_installed_environment_runs_by_its_id(tmp_path: pathlib.Path, ref: str) -> None:
    """The id as typed for ``vf-eval``, bare or as a hub id (owner and version dropped, as
    upstream's loader drops them)."""
    done = _eval(tmp_path, _install(tmp_path, PACKAGE), ref)
    assert done.returncode == 0, done.stderr
    assert "mean reward 1.0000" in done.stdout and "stop conditions  agent_completed=12" in done.stdout, done.stdout


def test_an_environment_with_its_own_env_class_is_refused_in_one_line(tmp_path: pathlib.Path) -> None:
    """A package that exports an ``Env`` subclass (upstream's multi-agent episodes) beside
    its taskset asks for what our rollout does not map: refused before anything runs."""
    body = PACKAGE.replace(
        '__all__ = ["SumTaskset"]',
        textwrap.dedent("""
        class Duel(vf.Env):
            async def run(self, task, agents) -> None:
                await agents.agent.run(task)


        __all__ = ["SumTaskset", "Duel"]
    """),
    )
    done = _eval(tmp_path, _install(tmp_path, body), "my-env")
    assert done.returncode == 2, done.stdout
    assert done.stderr.splitlines() == [
        "rollout-ray eval: error: verifiers taskset my-env: not mapped onto rollout_ray yet: it defines its own "
        "Env (Duel: multi-agent episodes); only tasksets run by upstream's single-agent env are"
    ]
    assert not (tmp_path / "run").exists()
