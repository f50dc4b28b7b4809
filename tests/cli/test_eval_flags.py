"""eval's flags reach the run: its manifest, its requests, its stored columns and its summary."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rollout_ray import read_run
from rollout_ray._cli import main as cli
from rollout_ray._cli.runs import served_model
from rollout_ray._errors import UsageError
from rollout_ray._record.arrow import table_to_traces
from rollout_ray._record.store import read_manifest

ARITH = str(pathlib.Path(__file__).parents[2] / "examples" / "arith.py")
CALC = str(pathlib.Path(__file__).parents[2] / "examples" / "calc_tool.py")


def _eval(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["eval", *argv, "--executor", "local", "--sim-ttft", "0"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_every_flag_lands_in_the_manifest_and_the_requests(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    out = str(tmp_path / "run")
    code, stdout, stderr = _eval(
        capsys,
        ARITH,
        "--out",
        out,
        "--limit",
        "2",
        "--samples",
        "2",
        "--temperature",
        "0.3",
        "--top-p",
        "0.9",
        "--max-tokens",
        "64",
        "--seed",
        "7",
        "--sampling",
        '{"top_k": 20, "temperature": 1.5}',
        "--max-turns",
        "3",
        "--max-tokens-total",
        "9000",
        "--max-input-tokens",
        "8000",
        "--max-output-tokens",
        "700",
        "--timeout-setup",
        "30",
        "--timeout-agent",
        "120",
        "--pass-k",
        "2,1",
        "--retries",
        "1",
        "--retry-failed",
    )
    assert code == 0, stderr
    config = read_manifest(out).config["eval"]
    assert config["sampling"] == {"top_k": 20, "temperature": 0.3, "top_p": 0.9, "max_tokens": 64, "seed": 7}
    assert config["limits"] == {
        "max_turns": 3,
        "max_input_tokens": 8000,
        "max_output_tokens": 700,
        "max_total_tokens": 9000,
    }
    assert (config["timeouts"]["setup"], config["timeouts"]["agent"]) == (30.0, 120.0)
    assert config["finalize"]["pass_k"] == [1, 2]
    assert (config["max_infra_retries"], config["retry_failed"]) == (1, True)
    (call,) = table_to_traces(read_run(out).slice(0, 1))[0].calls
    assert call.sampling == {"top_k": 20, "temperature": 0.3, "top_p": 0.9, "max_tokens": 64, "seed": 7}


def test_the_stored_samples_have_the_columns_users_filter_on(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    out = str(tmp_path / "run")
    code, _, stderr = _eval(capsys, ARITH, "--out", out, "--limit", "3", "--samples", "2", "--temperature", "0.5")
    assert code == 0, stderr
    table = read_run(out)
    rows = table.select(
        ["model", "harness", "sampling", "data_idx", "data_prompt", "data_answer", "advantage", "group_mean"]
    ).to_pylist()
    assert {(r["model"], r["harness"], r["sampling"]) for r in rows} == {("simulated", "chat", '{"temperature":0.5}')}
    assert [r["data_idx"] for r in rows] == [0, 0, 1, 1, 2, 2]
    assert rows[0]["data_prompt"].startswith("What is ") and isinstance(rows[0]["data_answer"], int)
    assert str(table.schema.field("data_network_allow").type) == "null"  # None everywhere
    assert "trace" in table.column_names  # the lossless copy stays
    traces = table_to_traces(table)
    assert [t.task.data["answer"] for t in traces] == [r["data_answer"] for r in rows]


def test_a_data_field_that_is_not_a_scalar_is_json_and_mixed_shards_read_as_text(tmp_path: pathlib.Path) -> None:
    import pyarrow as pa

    from rollout_ray._driver.run_dir import _data_column
    from rollout_ray._record.store import _concat

    assert _data_column([[1, 2], None, {"a": 1}]).to_pylist() == ["[1,2]", None, '{"a":1}']
    assert _data_column([1, 2.5]).type == pa.float64()
    assert _data_column([1, "x"]).to_pylist() == ["1", '"x"']
    joined = _concat([pa.table({"data_x": pa.array([1])}), pa.table({"data_x": pa.array(["a"])})])
    assert joined.column("data_x").to_pylist() == ["1", "a"]


def test_the_summary_has_every_pass_at_k_the_metrics_time_and_rate(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    code, stdout, stderr = _eval(capsys, CALC, "--out", str(tmp_path / "run"), "--limit", "2", "--samples", "4")
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert lines[2] == "pass@k  pass@1 1.0000  pass@2 1.0000  pass@4 1.0000"
    assert lines[3] == "metrics (mean / p50 / p95)"
    assert lines[4].split() == ["tool_calls", "1.0000", "1.0000", "1.0000"]
    assert lines[-2].startswith("wall ") and "rollouts/s over the rollouts' " in lines[-2]


def test_the_summary_puts_a_halt_first() -> None:
    import pyarrow as pa

    from rollout_ray._cli.summary import format_summary, summarize

    samples = pa.table(
        {
            "ok": [False],
            "reward": [0.0],
            "stop_condition": [None],
            "error_type": ["ProviderError"],
            "error_message": ["503 from the provider"],
            "metrics": pa.array([[("m", 2.0)]], pa.map_(pa.string(), pa.float64())),
        }
    )
    groups = pa.table({"group_id": ["g"], "n_valid": [8], "n_correct": [3]})
    s = summarize(samples, groups, status="halted", reason="circuit breaker: 10 consecutive provider failures")
    text = format_summary(s).splitlines()
    assert text[0] == "halted: circuit breaker: 10 consecutive provider failures"
    assert text[1].startswith("rollouts 1  ok 0  failed 1")
    assert sorted(s["pass_at"]) == [1, 2, 4, 8]  # every k that 8 samples allow
    assert s["pass_at"][1] == pytest.approx(3 / 8) and s["pass_at"][8] == 1.0
    assert s["metrics"] == {"m": (2.0, 2.0, 2.0)}


def test_the_simulated_model_honours_temperature_and_seed(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    def rewards(name: str, *flags: str) -> list[float]:
        code, _, stderr = _eval(capsys, ARITH, "--out", str(tmp_path / name), "--limit", "10", "--samples", "2", *flags)
        assert code == 0, stderr
        return read_run(str(tmp_path / name), ["reward"]).column("reward").to_pylist()

    assert rewards("cold", "--temperature", "0") == [1.0] * 20
    hot = rewards("hot", "--temperature", "2", "--seed", "3")
    assert sum(hot) < 15  # wrong answers grow with temperature
    assert rewards("hot-again", "--temperature", "2", "--seed", "3") == hot  # the seed fixes the draws


class _Models(BaseHTTPRequestHandler):
    ids: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"object": "list", "data": [{"id": i, "object": "model"} for i in self.ids]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def models_server() -> Iterator[tuple[str, type[_Models]]]:
    handler = type("Handler", (_Models,), {"ids": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_model_url_without_model_asks_the_server(models_server: tuple[str, type[_Models]]) -> None:
    url, handler = models_server
    handler.ids = ["only-one"]
    assert served_model(url, None) == "only-one"
    handler.ids = ["a", "b"]
    with pytest.raises(UsageError, match=rf"^--model-url {url} serves 2 models \(a, b\); pass --model NAME$"):
        served_model(url, None)
    handler.ids = []
    with pytest.raises(UsageError, match=r"serves 0 models \(none\)"):
        served_model(url, None)
    with pytest.raises(
        UsageError,
        match=rf"^--model-url {url}/x: cannot list its models \(GET /models: HTTP 404 "
        r".*\); pass --model NAME$",
    ):
        served_model(url + "/x", None)


def test_model_url_down_without_model_says_the_server_is_unreachable(tmp_path: pathlib.Path) -> None:
    """Not "pass --model NAME": a name would not make the server answer. A real eval process,
    refused before Ray, at a loopback port bound by no listener (connections refused)."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}/v1"
        done = subprocess.run(
            [sys.executable, "-m", "rollout_ray", "eval", ARITH, "--model-url", url, "--out", str(tmp_path / "run")],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "RAY_TMPDIR": str(tmp_path / "ray-tmp")},
        )
    assert done.returncode == 2 and done.stdout == "", done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        f"rollout-ray eval: error: --model-url {url}: the server is unreachable "
        "([Errno 111] Connection refused); start it, or check the URL"
    ]
    assert not (tmp_path / "ray-tmp").exists() and not (tmp_path / "run").exists()


def test_eval_against_a_server_uses_its_only_model(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    import asyncio

    from rollout_ray import SimulatedModelServer

    loop = asyncio.new_event_loop()
    server = SimulatedModelServer()
    url = loop.run_until_complete(server.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        out = str(tmp_path / "run")
        code, _, stderr = _eval(capsys, ARITH, "--out", out, "--limit", "1", "--model-url", url)
        assert code == 0, stderr
        assert read_manifest(out).config["eval"]["model_name"] == "simulated"
        (call,) = table_to_traces(read_run(out).slice(0, 1))[0].calls
        assert call.model == "simulated"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
