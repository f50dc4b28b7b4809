"""The viewer's JSON API over real run directories, without a browser (issue 13 §4)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pytest
from viewer_runs import HOSTILE, failed, get, make_trace, rollout_id, serve_requests, write_run

from rollout_ray._cli.summary import plot
from rollout_ray._driver.finalize import finalize
from rollout_ray._record.arrow import RolloutRecord, records_to_table
from rollout_ray._record.store import ShardWriter, read_run
from rollout_ray._viewer import index as index_module
from rollout_ray._viewer.catalog import NotARunDirectory
from rollout_ray._viewer.server import STATIC_DIR, Viewer, start

N = 200


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(tmp_path_factory.mktemp("runs") / "arith", N, rows_per_shard=64)


def rows(viewer: Viewer, **params: Any) -> dict[str, Any]:
    return get(viewer, "/api/rollouts", run="arith", limit=500, **params)


def test_runs_are_the_directories_given_and_the_runs_under_a_directory(tmp_path: Path, run_dir: Path) -> None:
    write_run(tmp_path / "sweep" / "001-model=good", 8, run_id="a")
    write_run(tmp_path / "sweep" / "002-model=bad", 4, run_id="b")
    (tmp_path / "notes").mkdir()
    listed = get(Viewer([tmp_path, run_dir]), "/api/runs")["runs"]
    assert [(r["id"], r["rollouts"], r["run_id"]) for r in listed] == [
        ("sweep/001-model=good", 8, "a"),
        ("sweep/002-model=bad", 4, "b"),
        ("arith", N, "run-test"),
    ]
    assert listed[2]["shards"] == 4 and listed[2]["taskset"] == "tests/arith.py"


def test_a_directory_that_is_neither_a_run_nor_holds_runs_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty" / "deeper").mkdir(parents=True)
    with pytest.raises(NotARunDirectory, match="is not a run directory"):
        Viewer([tmp_path / "empty"])
    with pytest.raises(NotARunDirectory, match="no such directory"):
        Viewer([tmp_path / "missing"])
    result = subprocess.run(
        [sys.executable, "-m", "rollout_ray", "view", str(tmp_path / "empty"), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "is not a run directory" in result.stderr


def test_the_run_overview_counts_and_offers_the_filter_values(run_dir: Path) -> None:
    run = get(Viewer([run_dir]), "/api/run", run="arith")
    n_failed = sum(failed(i) for i in range(N))
    assert (run["rollouts"], run["failed"], run["ok"], run["groups"]) == (N, n_failed, N - n_failed, N // 4)
    assert dict(run["facets"]["stop_condition"])["error"] == n_failed
    assert set(dict(run["facets"]["error_type"])) == {"ToolsetError", "ProviderError", "(none)"}
    assert run["config"]["model"] == "simulated" and "reward" in run["columns"] and not run["stored_advantage"]


def test_pages_cover_every_rollout_once_in_write_order(run_dir: Path) -> None:
    viewer = Viewer([run_dir])
    pages = [get(viewer, "/api/rollouts", run="arith", offset=offset, limit=30) for offset in range(0, N, 30)]
    ids = [row["rollout_id"] for p in pages for row in p["rows"]]
    assert ids == [rollout_id(i) for i in range(N)]
    assert {(p["total"], p["matched"]) for p in pages} == {(N, N)}
    assert get(viewer, "/api/rollouts", run="arith", offset=N, limit=30)["rows"] == []


def test_sort_by_a_column_either_way_with_ties_in_write_order(run_dir: Path) -> None:
    viewer = Viewer([run_dir])
    down = rows(viewer, sort="reward", order="desc")["rows"]
    rewards = [r["reward"] for r in down]
    assert rewards == sorted(rewards, reverse=True) and len(down) == N
    top = [r["rollout_id"] for r in down if r["reward"] == rewards[0]]
    assert top == [rollout_id(i) for i in range(N) if rollout_id(i) in set(top)]
    up = rows(viewer, sort="task_idx")["rows"]
    assert [r["task_idx"] for r in up] == sorted(r["task_idx"] for r in up)
    status, body = serve_requests(viewer, "/api/rollouts?run=arith&sort=messages")[0]
    assert status == 400 and "cannot sort by 'messages'" in body["error"]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"ok": "false"}, lambda i: failed(i)),
        ({"ok": "true"}, lambda i: not failed(i)),
        ({"reward_min": "1"}, lambda i: not failed(i) and i % 3 != 0),
        ({"reward_min": "0.05", "reward_max": "0.5"}, lambda i: not failed(i) and i % 3 == 0),
        ({"stop": "max_turns"}, lambda i: not failed(i) and i % 11 == 5),
        ({"error": "ToolsetError"}, lambda i: failed(i) and i % 2 == 1),
        ({"error": "(any)"}, lambda i: failed(i)),
        ({"error": "(none)"}, lambda i: not failed(i)),
        ({"task": "calc"}, lambda i: (i // 4) % 2 == 1),
        ({"task": "7"}, lambda i: i // 4 == 7),
        ({"task": "0003kk"}, lambda i: i // 4 == 3),
        ({"group": "g0001"}, lambda i: 40 <= i < 80),
        ({"ok": "false", "task": "Arith", "sort": "sample_idx"}, lambda i: failed(i) and (i // 4) % 2 == 0),
    ],
)
def test_each_filter_keeps_exactly_the_matching_rollouts(run_dir: Path, params: dict[str, str], expected: Any) -> None:
    result = rows(Viewer([run_dir]), **params)
    assert {r["rollout_id"] for r in result["rows"]} == {rollout_id(i) for i in range(N) if expected(i)}
    assert result["matched"] == len(result["rows"]) and result["total"] == N


def test_a_filter_value_that_does_not_parse_is_a_400(run_dir: Path) -> None:
    answers = serve_requests(
        Viewer([run_dir]),
        "/api/rollouts?run=arith&reward_min=high",
        "/api/rollouts?run=arith&ok=maybe",
        "/api/rollouts?run=nope",
        "/api/rollout?run=arith&id=nope",
    )
    assert [status for status, _ in answers] == [400, 400, 404, 404]
    assert "reward_min must be a number" in answers[0][1]["error"]


def test_a_failed_rollout_shows_its_conversation_error_traceback_and_timing(run_dir: Path) -> None:
    r = get(Viewer([run_dir]), "/api/rollout", run="arith", id=rollout_id(3))
    assert (r["ok"], r["stop_condition"], r["group_id"], r["sample_idx"]) == (False, "error", "g00000", 3)
    assert [m["role"] for m in r["messages"]] == ["system", "user", "assistant", "tool"]
    call_ = r["messages"][2]["tool_calls"][0]
    assert call_["name"] == "add" and json.loads(call_["arguments"]) == {"a": 103, "b": 10}
    assert r["messages"][3]["text"] == "113" and r["messages"][3]["tool_call_id"] == "call_3"
    [error] = r["errors"]
    assert error["type"] == "ToolsetError" and "crashed on rollout 3" in error["message"]
    assert "Traceback (most recent call last)" in error["traceback"] and "call_tool" in error["traceback"]
    assert [s["name"] for s in r["timing"]["spans"]] == ["boot", "setup", "agent", "finalize", "scoring"]
    assert r["tool_calls"][0]["ok"] is False and r["calls"][0]["usage"]["input"] == 40


def test_an_ok_rollout_shows_its_rewards_and_metrics(run_dir: Path) -> None:
    r = get(Viewer([run_dir]), "/api/rollout", run="arith", id=rollout_id(4))
    assert r["rewards"] == [
        {"name": "correct", "score": 1.0, "weight": 1.0},
        {"name": "format", "score": 1.0, "weight": 0.1},
    ]
    assert r["metrics"] == [{"name": "reply_chars", "value": 14.0}] and r["reward"] == pytest.approx(1.1)
    assert r["messages"][-1] == {**r["messages"][-1], "role": "assistant", "text": "The sum is 115."}


def test_siblings_carry_the_advantages_finalize_computes(run_dir: Path) -> None:
    group = get(Viewer([run_dir]), "/api/siblings", run="arith", id=rollout_id(5))
    assert group["group_id"] == "g00001" and group["advantage_source"] == "computed"
    stored = read_run(run_dir, columns=["rollout_id", "group_id", "ok", "reward"])
    expected = finalize(stored.filter(pa.compute.equal(stored["group_id"], "g00001"))).samples
    assert [(s["rollout_id"], s["advantage"]) for s in group["rows"]] == list(
        zip(expected["rollout_id"].to_pylist(), expected["advantage"].to_pylist())
    )
    assert [s["sample_idx"] for s in group["rows"]] == [0, 1, 2, 3]
    assert [s["advantage"] is None for s in group["rows"]] == [failed(i) for i in range(4, 8)]


def test_stored_advantages_are_preferred_and_shown_in_the_table(tmp_path: Path) -> None:
    records = [RolloutRecord(make_trace(i), "run-adv", f"g{i // 4:05d}", i % 4) for i in range(8)]
    table = records_to_table(records)
    table = table.append_column("advantage", pa.array([float(i) / 10 for i in range(8)]))
    write_run(tmp_path / "adv", 0, run_id="run-adv")
    with ShardWriter(tmp_path / "adv") as writer:
        writer.write(table)
    viewer = Viewer([tmp_path / "adv"])
    group = get(viewer, "/api/siblings", run="adv", id=rollout_id(6))
    assert group["advantage_source"] == "stored"
    assert [s["advantage"] for s in group["rows"]] == [0.4, 0.5, 0.6, 0.7]
    page = get(viewer, "/api/rollouts", run="adv", sort="advantage", order="desc", limit=3)
    assert [r["advantage"] for r in page["rows"]] == [0.7, 0.6, 0.5]
    assert get(viewer, "/api/run", run="adv")["stored_advantage"] is True


def test_model_output_comes_back_verbatim_and_the_page_never_parses_it_as_html(run_dir: Path) -> None:
    r = get(Viewer([run_dir]), "/api/rollout", run="arith", id=rollout_id(1))
    assert r["messages"][1]["text"] == HOSTILE
    source = (STATIC_DIR / "app.js").read_text()
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function", source)
    status, html = serve_requests(Viewer([run_dir]), "/")[0]
    assert status == 200 and b'<script src="/static/app.js"' in html


def test_the_page_is_served_with_a_strict_policy_and_foreign_hosts_are_refused(run_dir: Path) -> None:
    async def go() -> tuple[str, int, int]:
        runner, url = await start(Viewer([run_dir]))
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(url) as page:
                    policy = page.headers["Content-Security-Policy"]
                async with session.get(url + "static/app.js") as script:
                    script_status = script.status
                async with session.get(url + "api/runs", headers={"Host": "evil.example:80"}) as rebound:
                    return policy, script_status, rebound.status
        finally:
            await runner.cleanup()

    policy, script_status, rebound = asyncio.run(go())
    assert "default-src 'self'" in policy and script_status == 200 and rebound == 403


def test_the_plot_is_drawn_on_demand(run_dir: Path) -> None:
    ((status, png),) = serve_requests(Viewer([run_dir], plot=plot), "/api/plot.png?run=arith")
    assert status == 200 and png.startswith(b"\x89PNG")
    assert serve_requests(Viewer([run_dir]), "/api/plot.png?run=arith")[0][0] == 404
    assert not (run_dir / "report.png").exists()


def test_the_index_reads_scalar_columns_once_and_only_new_shards_after(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    run = write_run(tmp_path / "live", 100, rows_per_shard=50)
    reads: list[str] = []
    real = index_module.read_scalars
    monkeypatch.setattr(
        index_module, "read_scalars", lambda folder, name, run_id: reads.append(name) or real(folder, name, run_id)
    )
    viewer = Viewer([run])
    assert get(viewer, "/api/run", run="live")["rollouts"] == 100
    first = viewer._indexes["live"]
    assert "trace" not in first.table.column_names and "messages" not in first.table.column_names
    get(viewer, "/api/rollouts", run="live")
    assert viewer._indexes["live"] is first and reads == ["part-00000.parquet", "part-00001.parquet"]
    with ShardWriter(run, rows_per_shard=50) as writer:  # the run goes on while it is viewed
        writer.write(
            records_to_table(
                [RolloutRecord(make_trace(i), "run-test", f"g{i // 4:05d}", i % 4) for i in range(100, 130)]
            )
        )
    page = get(viewer, "/api/rollouts", run="live", offset=120, limit=50)
    assert page["total"] == 130 and [r["rollout_id"] for r in page["rows"]] == [rollout_id(i) for i in range(120, 130)]
    assert reads == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert get(viewer, "/api/rollout", run="live", id=rollout_id(125))["id"] == rollout_id(125)


def test_a_corrupt_shard_is_reported_not_hidden(tmp_path: Path) -> None:
    run = write_run(tmp_path / "broken", 20, rows_per_shard=10)
    shard = run / "shards" / "part-00001.parquet"
    shard.write_bytes(shard.read_bytes()[:200])
    status, body = serve_requests(Viewer([run]), "/api/rollouts?run=broken")[0]
    assert status == 500 and "part-00001.parquet" in body["error"] and "corrupt" in body["error"]


def test_a_redone_rollout_supersedes_its_earlier_row_as_read_run_says(tmp_path: Path) -> None:
    run = write_run(tmp_path / "redo", 8, rows_per_shard=8)
    redo = make_trace(100)  # a new attempt at row 3's (group, sample), stored in a later shard
    with ShardWriter(run) as writer:
        writer.write(records_to_table([RolloutRecord(redo, "run-test", "g00000", 3, attempt=1)]))
    viewer = Viewer([run])
    page = get(viewer, "/api/rollouts", run="redo")
    expected = read_run(run, columns=["rollout_id"])["rollout_id"].to_pylist()
    assert [r["rollout_id"] for r in page["rows"]] == expected == [rollout_id(i) for i in (0, 1, 2, 4, 5, 6, 7, 100)]
    assert page["rows"][-1]["attempt"] == 1
    assert [s["rollout_id"] for s in get(viewer, "/api/siblings", run="redo", id=redo.id)["rows"]] == [
        rollout_id(i) for i in (0, 1, 2, 100)
    ]
    assert get(viewer, "/api/rollout", run="redo", id=redo.id)["attempt"] == 1
    assert get(viewer, "/api/runs")["runs"][0]["rollouts"] == len(expected) == 8  # the runs list counts the same


def test_the_mean_reward_counts_a_failed_rollout_as_zero_as_the_summary_does(tmp_path: Path) -> None:
    run = write_run(tmp_path / "scored", 2, rows_per_shard=8)  # rollouts 0 and 1: ok, rewarded 0.1 and 1.1
    late = make_trace(5)  # scored, then failed: its reward map stays, it counts for 0
    late.ok = False
    with ShardWriter(run) as writer:
        writer.write(records_to_table([RolloutRecord(late, "run-test", "g00001", 0)]))
    overview = get(Viewer([run]), "/api/run", run="scored")
    assert late.reward > 0 and (overview["rollouts"], overview["mean_reward"]) == (3, pytest.approx(1.2 / 3))


def test_a_shard_of_another_run_is_refused_not_mixed_in(tmp_path: Path) -> None:
    run = write_run(tmp_path / "mixed", 4)
    with ShardWriter(run) as writer:
        writer.write(records_to_table([RolloutRecord(make_trace(9), "some-other-run", "g00009", 0)]))
    status, body = serve_requests(Viewer([run]), "/api/rollouts?run=mixed")[0]
    assert status == 500 and "part-00001.parquet" in body["error"] and "some-other-run" in body["error"]


def test_ten_thousand_rollouts_page_filter_and_open(tmp_path: Path) -> None:
    run = write_run(tmp_path / "big", 10_000, rows_per_shard=2_500)
    viewer = Viewer([run])
    first = get(viewer, "/api/rollouts", run="big", limit=50)
    assert first["total"] == 10_000 and len(first["rows"]) == 50
    failures = get(viewer, "/api/rollouts", run="big", ok="false", sort="reward", order="desc", offset=100, limit=50)
    assert failures["matched"] == sum(failed(i) for i in range(10_000)) and len(failures["rows"]) == 50
    assert get(viewer, "/api/rollout", run="big", id=rollout_id(9_998))["messages"][1]["text"] == "What is 148 + 8?"


def test_the_command_serves_until_interrupted(run_dir: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollout_ray", "view", str(run_dir), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("viewing 1 run(s) at http://127.0.0.1:"), line + proc.stderr.read()  # type: ignore[union-attr]
        url = line.split(" at ", 1)[1].split()[0]
        with urllib.request.urlopen(f"{url}api/runs", timeout=10) as response:
            assert json.load(response)["runs"][0]["rollouts"] == N
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]


MODELS = {  # the manifest's model, as eval and sweep record it (``_cli/drive.open_model``), and as a string
    "served": (
        {"url": "http://127.0.0.1:8000/v1", "name": "Qwen/Qwen3-8B"},
        {"name": "Qwen/Qwen3-8B", "served": "http://127.0.0.1:8000/v1"},
    ),
    "simulated": (
        {"simulated": {"model_name": "simulated", "ttft": 0.05}},
        {"name": "simulated", "served": "the built-in simulated model server"},
    ),
    "named": ("gpt-4o", {"name": "gpt-4o", "served": None}),
}


def test_the_model_of_a_run_is_its_name_and_where_it_is_served(tmp_path: Path) -> None:
    """Issue 34 §5: the manifest's model is a record, which the page printed as [object Object]."""
    for name, (record, _) in MODELS.items():
        write_run(tmp_path / name, 4, config={"taskset": "tests/arith.py", "model": record})
    viewer = Viewer([tmp_path])
    listed = {r["id"]: r["model"] for r in get(viewer, "/api/runs")["runs"]}
    assert listed == {name: shown for name, (_, shown) in MODELS.items()}
    for name, (record, shown) in MODELS.items():
        run = get(viewer, "/api/run", run=name)
        assert run["model"] == shown and run["config"]["model"] == record  # the manifest's own record stays


def test_each_user_turn_says_who_produced_it_a_simulated_user_or_the_task(tmp_path: Path) -> None:
    """tau2-bench#392: a simulator's turns must be told apart from the task's in the record
    and on the rollout page."""
    from rollout_ray import ScriptedUser, Task, Trace
    from rollout_ray.testing import ScriptedModel

    from conftest import make_rollout, run

    class Booking(Task):
        def user_simulator(self) -> ScriptedUser:
            return ScriptedUser(["Move my flight please", "It is ABC123"], name="customer")

    trace = run(make_rollout(Booking({"prompt": "Hello"}), model=ScriptedModel(["Which?", "moved", "ok"])).run())
    assert [t.by for t in trace.user_turns if not t.done] == ["customer", "customer"]

    def shape(i: int, row: Trace) -> Trace:
        return trace if i == 0 else row

    write_run(tmp_path / "sim", 2, shape=shape)
    r = get(Viewer([tmp_path / "sim"]), "/api/rollout", run="sim", id=trace.id)
    users = [(m["text"], m["by_kind"], m["by"]) for m in r["messages"] if m["role"] == "user"]
    assert users == [
        ("Hello", "task", "task"),
        ("Move my flight please", "simulator", "customer"),
        ("It is ABC123", "simulator", "customer"),
    ]
    assert all("agent" not in m for m in r["messages"])  # one policy agent: no agent labels
