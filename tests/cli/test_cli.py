"""The rollout-ray command line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest


def test_serve_model_answers_until_interrupted() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollout_ray", "serve-model", "--port", "0", "--ttft", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("simulated model serving at http://127.0.0.1:")
        url = line.rsplit(" ", 1)[1].strip()
        body = json.dumps({"messages": [{"role": "user", "content": "What is 17 + 25?"}]}).encode()
        request = urllib.request.Request(
            f"{url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            answer = json.load(resp)
        assert answer["choices"][0]["message"]["content"] == "42"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]


def test_serve_model_rejects_invalid_settings_with_the_field_named() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rollout_ray", "serve-model", "--error-rate", "2"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "invalid settings" in result.stderr and "error_rate" in result.stderr


def _rollout_ray(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rollout_ray", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(300)  # three CLI processes: 39 s with the machine's two cores busy twice over
def test_eval_then_report_on_a_run_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run_dir = str(tmp_path / "run")
    result = _rollout_ray(
        "eval", "examples/arith.py", "--executor", "local", "--limit", "5", "--samples", "2", "--out", run_dir
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rollouts 10  ok 10  failed 0  groups 5" in result.stdout
    assert "mean reward 1.0000" in result.stdout and "pass@1 1.0000" in result.stdout
    assert "stop conditions  agent_completed=10" in result.stdout
    report = _rollout_ray("report", run_dir)
    assert report.returncode == 0, report.stderr[-2000:]
    assert report.stdout.splitlines()[0] == "rollouts 10  ok 10  failed 0  groups 5"
    with open(f"{run_dir}/report.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    again = _rollout_ray(
        "eval",
        "examples/arith.py",
        "--executor",
        "local",
        "--limit",
        "5",
        "--samples",
        "2",
        "--out",
        run_dir,
        "--resume",
    )
    assert again.returncode == 0 and "rollouts 10  ok 10" in again.stdout  # nothing rerun


def test_eval_explains_a_bad_taskset() -> None:
    result = _rollout_ray("eval", "examples/agent_program.py", "--executor", "local")
    assert result.returncode != 0 and "must define tasks()" in result.stderr


@pytest.mark.parametrize("example", ["calc_tool", "program", "mcp_tools"])
def test_example_tasksets_run(example: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = _rollout_ray(
        "eval",
        f"examples/{example}.py",
        "--executor",
        "local",
        "--limit",
        "2",
        "--samples",
        "1",
        "--out",
        str(tmp_path / "run"),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rollouts 2  ok 2  failed 0  groups 2" in result.stdout
    assert "mean reward 1.0000" in result.stdout


@pytest.mark.timeout(300)  # one CLI process that starts its own Ray
def test_the_user_simulator_example_runs_on_ray(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """examples/user_sim.py on Ray: the customer's turns cross back with the trace, apart from
    the policy's calls, and the reward saw the whole dialogue."""
    from rollout_ray import read_run, table_to_traces

    run_dir = str(tmp_path / "run")
    result = _rollout_ray("eval", "examples/user_sim.py", "--limit", "2", "--samples", "2", "--out", run_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rollouts 4  ok 4  failed 0  groups 2" in result.stdout and "mean reward 1.0000" in result.stdout
    for trace in table_to_traces(read_run(run_dir)):
        asked, ended = trace.user_turns
        assert asked.by == "customer" and trace.nodes[asked.node].message.content == asked.content  # type: ignore[index]
        assert ended.done and trace.num_turns == len(trace.calls) == 2


@pytest.mark.timeout(300)  # one CLI process that starts its own Ray
def test_the_shared_tools_example_starts_one_server_for_all_rollouts_on_ray(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """examples/shared_tools.py on Ray: 8 rollouts over two rollout actors, one calculator
    server started for all of them (the node's record of it), gone once the run ended."""
    import json

    from rollout_ray import read_run, table_to_traces

    from conftest import wait_exit

    shared = tmp_path / "shared"
    monkeypatch.setenv("ROLLOUT_RAY_SHARED_DIR", str(shared))
    run_dir = str(tmp_path / "run")
    result = _rollout_ray("eval", "examples/shared_tools.py", "--limit", "4", "--samples", "2", "--out", run_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rollouts 8  ok 8  failed 0  groups 4" in result.stdout and "mean reward 1.0000" in result.stdout
    [state] = [json.loads(p.read_text()) for p in shared.glob("calc-*.json")]
    assert state["starts"] == 1
    wait_exit(state["pid"], 30)  # stopped with the rollout actor that started it, at the run's end
    for trace in table_to_traces(read_run(run_dir)):
        assert [(c.server, c.name, c.ok) for c in trace.tool_calls] == [("calc", "add", True)]


@pytest.mark.timeout(300)  # one CLI process that starts its own Ray
def test_the_two_player_example_runs_on_ray_with_a_batch_per_agent(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """examples/two_player.py on Ray: both players rewarded, each with its own branch and its
    own token sequence in the stored trace."""
    from rollout_ray import agent_sequences, read_run, table_to_traces

    run_dir = str(tmp_path / "run")
    result = _rollout_ray("eval", "examples/two_player.py", "--limit", "2", "--samples", "2", "--out", run_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rollouts 4  ok 4  failed 0  groups 2" in result.stdout and "mean reward 2.0000" in result.stdout
    for trace in table_to_traces(read_run(run_dir)):
        by_agent = agent_sequences(trace)
        assert trace.num_branches == 2 and sorted(by_agent) == ["agent", "player_b"]
        assert [len(by_agent[a][0].turns) for a in ("agent", "player_b")] == [3, 2]
    stored = read_run(run_dir).select(["token_agent", "agent_rewards"]).to_pylist()
    assert all(sorted(row["token_agent"]) == ["agent", "player_b"] for row in stored)
    assert all(dict(row["agent_rewards"]) == {"agent": 1.0, "player_b": 1.0} for row in stored)


def test_a_taskset_file_ships_the_plain_modules_beside_it_that_it_imports() -> None:
    """examples/program.py imports calc_tool from its own folder: Ray workers can import
    neither, so both go by value (this once failed `rollout-ray eval examples/program.py`)."""
    from rollout_ray import ChatHarness
    from rollout_ray._cli.taskset_loader import import_taskset
    from rollout_ray._ray.ray_executor import modules_to_ship

    module = import_taskset("examples/program.py")
    task_class = type(next(iter(module.tasks())))
    shipped = modules_to_ship(task_class)
    assert shipped[0].__file__ == module.__file__ and "calc_tool" in {m.__name__ for m in shipped}
    assert all(os.path.dirname(m.__file__) == os.path.dirname(module.__file__) for m in shipped)
    assert modules_to_ship(ChatHarness) == []  # installed with the package: workers import it


def test_runtime_host_and_executors_refuse_an_unknown_runtime_kind() -> None:
    from rollout_ray import LocalExecutor
    from rollout_ray._runtimes.host import RuntimeHost

    for make in (lambda: RuntimeHost(kind="docker"), lambda: LocalExecutor(runtime="docker")):
        with pytest.raises(ValueError, match="one of \\('auto', 'local', 'sandbox', 'podman'\\), got 'docker'"):
            make()


def test_auto_is_the_sandbox_where_the_machine_runs_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import dataclasses

    from rollout_ray._runtimes import host, providers

    sandbox = providers.provider("sandbox")

    def unavailable(reason: str | None) -> None:
        monkeypatch.setitem(providers._registry, "sandbox", dataclasses.replace(sandbox, unavailable=lambda: reason))

    unavailable(None)
    assert host.runtime_kind("auto") == ("sandbox", None)
    unavailable("no bwrap here")
    monkeypatch.setattr(providers, "_said", set())
    with caplog.at_level("WARNING", logger="rollout_ray"):
        assert host.runtime_kind("auto") == ("local", "no bwrap here")
        assert host.runtime_kind("auto") == ("local", "no bwrap here")
    said = [r.getMessage() for r in caplog.records if "sandbox runtime" in r.getMessage()]
    assert said == [
        "this machine cannot run the sandbox runtime (no bwrap here): rollouts run in the local runtime, "
        "which isolates them neither from each other nor from the host"
    ]  # once
    assert host.runtime_kind("local") == ("local", None)
