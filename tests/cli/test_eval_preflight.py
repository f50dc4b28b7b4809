"""eval's mistakes found before anything starts: an unreachable Ray, a bad --out, a taskset that
does not import, settings that would do nothing. Each is one line on stderr, exit 2, in about a
second, with no Ray started and nothing written. Real CLI processes."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import pytest

from rollout_ray._record.manifest import RunLock

ROOT = pathlib.Path(__file__).parents[2]
ARITH = str(ROOT / "examples" / "arith.py")
CLI = [sys.executable, "-m", "rollout_ray"]


def _eval(
    tmp_path: pathlib.Path, *argv: str, cwd: pathlib.Path | None = None, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """The CLI with a Ray temp dir of its own (so a Ray that starts shows), and its seconds."""
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environment.update(env or {}, RAY_TMPDIR=str(tmp_path / "ray-tmp"))
    started = time.monotonic()
    done = subprocess.run([*CLI, "eval", *argv], capture_output=True, text=True, timeout=60, cwd=cwd, env=environment)
    return done, time.monotonic() - started


def _refused(tmp_path: pathlib.Path, *argv: str, **kwargs: Any) -> str:
    """The one line of a refused eval; nothing started, nothing printed on stdout."""
    done, seconds = _eval(tmp_path, *argv, **kwargs)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr[-3000:]  # no header, no Ray log, no traceback
    assert not (tmp_path / "ray-tmp").exists()  # Ray never started
    assert seconds < 30, seconds  # Python's start and imports; Ray's own retries take ~40 s
    return lines[0]


def test_an_unreachable_ray_address_is_one_line(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "run"
    line = _refused(tmp_path, ARITH, "--address", "127.0.0.1:1", "--out", str(out))
    assert line == "rollout-ray eval: cannot reach Ray at 127.0.0.1:1 (Connection refused); check --address"
    assert not out.exists()


def test_an_unreachable_ray_address_from_the_environment_names_it(tmp_path: pathlib.Path) -> None:
    line = _refused(tmp_path, ARITH, "--out", str(tmp_path / "run"), env={"RAY_ADDRESS": "127.0.0.1:1"})
    assert line == "rollout-ray eval: cannot reach Ray at 127.0.0.1:1 (Connection refused); check RAY_ADDRESS"


@pytest.mark.slow
@pytest.mark.ray
def test_a_reachable_address_is_joined_with_an_actor_per_cpu_of_the_cluster(
    ray_cluster: Any, tmp_path: pathlib.Path
) -> None:
    address = ray_cluster.get_runtime_context().gcs_address
    cpus = int(ray_cluster.cluster_resources()["CPU"])
    out = tmp_path / "run"
    done, _ = _eval(
        tmp_path, ARITH, "--address", address, "--limit", "2", "--samples", "1", "--sim-ttft", "0", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rollouts 2  ok 2  failed 0" in done.stdout
    (warmup,) = [s for s in done.stderr.splitlines() if s.startswith("warmup ")]
    assert f": Ray, {cpus} rollout actors " in warmup, warmup


def _stored_run(tmp_path: pathlib.Path) -> pathlib.Path:
    out = tmp_path / "stored"
    done, _ = _eval(
        tmp_path, ARITH, "--executor", "local", "--limit", "1", "--samples", "1", "--sim-ttft", "0", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_an_existing_run_needs_resume_or_overwrite(tmp_path: pathlib.Path) -> None:
    out = _stored_run(tmp_path)
    manifest = (out / "manifest.json").read_bytes()
    assert _refused(tmp_path, ARITH, "--out", str(out)) == (
        f"rollout-ray eval: error: --out {out} already holds a run; pass --resume to continue it, or --overwrite "
        "to replace it"
    )
    assert (out / "manifest.json").read_bytes() == manifest


@pytest.mark.parametrize(
    ("make", "out", "message"),
    [
        ("file", "f", "--out {out} is a file; choose a directory"),
        ("file", "f/run", "--out {out}: {tmp}/f is a file, not a directory; choose another --out"),
        ("file", "f/a/b", "--out {out}: {tmp}/f is a file, not a directory; choose another --out"),
        (
            "dir",
            "d",
            "--overwrite: {out} is not a run directory (no manifest.json); nothing there is replaced: "
            "choose another --out",
        ),
        (
            "link",
            "l",
            "--out {out} is a symbolic link; a run directory is never reached through one: pass the directory itself",
        ),
    ],
)
def test_a_bad_out_is_one_line_before_ray(tmp_path: pathlib.Path, make: str, out: str, message: str) -> None:
    target = tmp_path / out.split("/")[0]
    if make == "file":
        target.write_text("mine\n")
    elif make == "dir":
        target.mkdir()
        (target / "notes.txt").write_text("mine\n")
    else:
        target.symlink_to(_stored_run(tmp_path), target_is_directory=True)
    argv = ["--out", str(tmp_path / out)] + (["--overwrite"] if make != "file" else [])
    line = _refused(tmp_path, ARITH, *argv)
    assert line == "rollout-ray eval: error: " + message.format(out=tmp_path / out, tmp=tmp_path)
    assert target.is_symlink() or (target / "notes.txt").exists() or target.read_text() == "mine\n"


def test_resume_and_overwrite_exclude_each_other(tmp_path: pathlib.Path) -> None:
    line = _refused(tmp_path, ARITH, "--out", str(tmp_path / "run"), "--resume", "--overwrite")
    assert line == (
        "rollout-ray eval: error: --resume and --overwrite exclude each other: continue the run in --out, or replace it"
    )


def test_a_run_another_process_writes_is_refused_before_ray(tmp_path: pathlib.Path) -> None:
    out = _stored_run(tmp_path)
    lock = RunLock(out)
    lock.acquire()
    try:
        line = _refused(tmp_path, ARITH, "--out", str(out), "--resume")
    finally:
        lock.release()
    assert line == (
        f"rollout-ray eval: error: {out} is in use by another process (pid {os.getpid()}); wait for "
        "it, or use another --out"
    )


def test_overwrite_replaces_a_run_and_only_its_contents(tmp_path: pathlib.Path) -> None:
    out = _stored_run(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine\n")
    (out / "link").symlink_to(outside, target_is_directory=True)  # inside the run: removed, not followed
    before = (out / "manifest.json").read_text()
    done, _ = _eval(
        tmp_path,
        ARITH,
        "--executor",
        "local",
        "--limit",
        "2",
        "--samples",
        "1",
        "--sim-ttft",
        "0",
        "--out",
        str(out),
        "--overwrite",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rollouts 2  ok 2  failed 0" in done.stdout
    assert (out / "manifest.json").read_text() != before and not (out / "link").exists()
    assert (outside / "keep.txt").read_text() == "mine\n"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "from rollout_ray import Task\n\ndef tasks(:\n    return []\n",
            "SyntaxError: invalid syntax (at bad.py:3: def tasks(:)",
        ),
        (
            "import json\nimport no_such_module_for_rollout_ray\n",
            "ModuleNotFoundError: No module named 'no_such_module_for_rollout_ray' "
            "(at bad.py:2: import no_such_module_for_rollout_ray)",
        ),
        (
            "import json\nROWS = json.loads('{')\n",
            "JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1) "
            "(at bad.py:2: ROWS = json.loads('{'))",
        ),
    ],
)
def test_a_taskset_that_does_not_import_names_the_users_line(tmp_path: pathlib.Path, source: str, message: str) -> None:
    (tmp_path / "bad.py").write_text(source)
    line = _refused(tmp_path, "bad.py", cwd=tmp_path)
    assert line == f"rollout-ray eval: error: importing bad.py raised {message}"


def test_a_task_with_an_empty_prompt_is_refused(tmp_path: pathlib.Path) -> None:
    (tmp_path / "empty_prompt.py").write_text(
        "from rollout_ray import ChatHarness, Task\n\n"
        "def tasks():\n    return [Task({'prompt': 'What is 1 + 1?'}), Task({'idx': 1, 'prompt': ''})]\n\n"
        "def harness():\n    return ChatHarness()\n"
    )
    line = _refused(tmp_path, "empty_prompt.py", cwd=tmp_path)
    assert line == (
        "rollout-ray eval: error: tasks() of empty_prompt.py raised ValidationError: TaskData: prompt: "
        "Value error, the prompt is empty; give the opening user turn, or prompt=None when a user "
        "opens the conversation"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--pass-k", "16", "--samples", "4"],
            "--pass-k 16: pass@k needs at least k samples per task, and there are 4 (--samples); lower --pass-k or "
            "raise --samples to 16",
        ),
        (
            ["--pass-k", "1,4,8", "--samples", "4"],
            "--pass-k 8: pass@k needs at least k samples per task, and there are 4 (--samples); lower --pass-k or "
            "raise --samples to 8",
        ),
        (["--sampling", '{"temprature": 0.7}'], "--sampling: unknown key 'temprature'; did you mean 'temperature'?"),
        (["--sampling", '{"top-k": 20}'], "--sampling: unknown key 'top-k'; did you mean 'top_k'?"),
        (
            ["--api-key-env", "ROLLOUT_RAY_UNSET_KEY", "--model-url", "http://127.0.0.1:1/v1", "--model", "m"],
            "--api-key-env ROLLOUT_RAY_UNSET_KEY: ROLLOUT_RAY_UNSET_KEY is not set; export it, or leave "
            "--api-key-env out for a server that needs no key",
        ),
    ],
)
def test_a_setting_that_would_do_nothing_is_an_error(tmp_path: pathlib.Path, argv: list[str], message: str) -> None:
    out = tmp_path / "run"
    assert _refused(tmp_path, ARITH, "--out", str(out), *argv) == f"rollout-ray eval: error: {message}"
    assert not out.exists()


def test_a_setting_that_may_be_meant_is_a_warning_and_the_run_goes_on(tmp_path: pathlib.Path) -> None:
    done, _ = _eval(
        tmp_path,
        ARITH,
        "--executor",
        "local",
        "--limit",
        "1",
        "--samples",
        "1",
        "--sim-ttft",
        "0",
        "--out",
        str(tmp_path / "run"),
        "--sampling",
        '{"guided_choice": ["2"]}',
        "--api-key-env",
        "ROLLOUT_RAY_UNSET_KEY",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [s for s in done.stderr.splitlines() if s.startswith("rollout-ray eval: warning: ")]
    assert warnings == [
        "rollout-ray eval: warning: --sampling: 'guided_choice' is not a known sampling parameter; it is sent "
        "upstream as is",
        "rollout-ray eval: warning: --api-key-env ROLLOUT_RAY_UNSET_KEY is not used: the built-in simulated "
        "model needs no key (pass --model-url)",
    ]


def test_help_says_how_many_actors_by_default() -> None:
    done = subprocess.run([*CLI, "eval", "--help"], capture_output=True, text=True, timeout=60)
    assert "one per CPU of the cluster, at most 32" in " ".join(done.stdout.split())
    from rollout_ray._ray.ray_executor import DEFAULT_ACTORS_CAP

    assert DEFAULT_ACTORS_CAP == 32


def test_a_task_asking_for_a_runtime_there_is_not_is_refused_naming_it(tmp_path: pathlib.Path) -> None:
    """Issue 32: a task's own runtime kind (``TaskData.runtime``) is checked with the run's,
    before anything starts, not when its rollout runs."""
    (tmp_path / "kinds.py").write_text(
        "from rollout_ray import ChatHarness, Task\n\n"
        "def tasks():\n    return [Task({'prompt': 'a'}), Task({'idx': 1, 'prompt': 'b', 'runtime': 'nope'})]\n\n"
        "def harness():\n    return ChatHarness()\n"
    )
    line = _refused(tmp_path, "kinds.py", "--runtime", "local", cwd=tmp_path)
    assert line.startswith("rollout-ray eval: error: task 1 asks for runtime 'nope': runtime must be one of (")
    assert "'local'" in line and "'podman'" in line and "got 'nope'" in line
