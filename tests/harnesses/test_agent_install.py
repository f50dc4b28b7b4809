"""An agent is installed once per node however many rollouts ask at once: the installers
queue on a file lock and the first one's install is everyone's; a failed install is a
HarnessError with the installer's output, leaving nothing half-done behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollout_ray import HarnessError
from rollout_ray._harnesses import agent_install

# Each installer process: the install command records that it ran, then holds the install
# until the test says go (a bounded wait on a file), so the others must queue behind it.
INSTALLER = """
import sys
from rollout_ray._harnesses.agent_install import _installed
script = "echo ran >> {root}/ran; mkdir {{dir}}/bin; i=0; until [ -e {root}/go ] || [ $i -ge 3000 ]; do sleep 0.01; i=$((i+1)); done"
print(_installed("tool@1", ["sh", "-c", script], "tool@1"))
"""


def _blocked_on(lock: Path) -> int:
    """Processes waiting for ``lock`` (``/proc/locks`` marks a waiter with ``->``)."""
    inode = f":{os.stat(lock).st_ino} "
    return sum("->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines())


def _until(check, what: str, seconds: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)  # a bounded poll of state other processes change


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks to see the waiters")
def test_concurrent_installs_run_the_installer_once(tmp_path: Path) -> None:
    env = {**os.environ, "ROLLOUT_RAY_AGENTS": str(tmp_path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", INSTALLER.format(root=tmp_path)], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    try:
        _until(lambda: (tmp_path / "ran").exists(), "the first install")
        lock = tmp_path / ".tool@1.lock"
        _until(lambda: _blocked_on(lock) == 3, "three installers queued on the lock")
        (tmp_path / "go").touch()
        outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert (tmp_path / "ran").read_text() == "ran\n"
    assert outputs == [str(tmp_path / "tool@1")] * 4 and (tmp_path / "tool@1" / "bin").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tool@1.lock", "go", "ran", "tool@1"]


def test_a_failed_install_is_a_harness_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLOUT_RAY_AGENTS", str(tmp_path))
    with pytest.raises(HarnessError, match=r"cannot install tool@2 \(sh exited 3\): no such version"):
        agent_install._installed("tool@2", ["sh", "-c", "echo no such version >&2; exit 3"], "tool@2")
    assert [p.name for p in tmp_path.iterdir()] == [".tool@2.lock"]
    assert agent_install.agents_dir() == tmp_path


def test_an_unwritable_install_directory_is_named_with_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("ROLLOUT_RAY_AGENTS", str(tmp_path / "file" / "agents"))
    with pytest.raises(HarnessError, match=r"cannot install tool@3 into .*file/agents: .*set ROLLOUT_RAY_AGENTS"):
        agent_install._installed("tool@3", ["true"], "tool@3")


def test_eval_says_before_the_run_that_an_agent_not_installed_here_will_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The install ran silently inside the first rollout's setup (minutes, hundreds of MB)."""
    from rollout_ray import ClaudeCodeHarness, CodexHarness, MiniSweAgentHarness
    from rollout_ray._cli.eval import _say_agent_install

    monkeypatch.setenv("ROLLOUT_RAY_AGENTS", str(tmp_path))
    assert CodexHarness(version="0.169.0").missing() == "npm @openai/codex@0.169.0"
    assert ClaudeCodeHarness(version="2.1.0").missing() == "npm @anthropic-ai/claude-code@2.1.0"
    assert MiniSweAgentHarness(version="2.4.6").missing() == "pip mini-swe-agent==2.4.6"
    _say_agent_install(CodexHarness(version="0.169.0"))
    assert "has not installed the agent yet (npm @openai/codex@0.169.0)" in capsys.readouterr().err
    (tmp_path / "@openai+codex@0.169.0").mkdir()
    assert CodexHarness(version="0.169.0").missing() is None
    _say_agent_install(CodexHarness(version="0.169.0"))
    assert capsys.readouterr().err == ""
