"""Token data from the command line: `rollout-ray eval` stores the ids and logprobs the server
offers (``--token-capture``, default auto), says so in its summary, and stores nothing (and
asks nothing) of a server that offers none. The real CLI, as a subprocess."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow.compute as pc
import pytest

from rollout_ray import Group, read_run, table_to_traces
from rollout_ray._record.tokens import token_sequences
from rollout_ray._record.trace import decode_trace

ARITH = str(Path(__file__).parents[2] / "examples" / "arith.py")


def rollout_ray(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rollout_ray", *args], capture_output=True, text=True, timeout=300)


def evaluate(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = rollout_ray(
        "eval",
        ARITH,
        "--executor",
        "local",
        "--limit",
        "3",
        "--samples",
        "2",
        "--sim-ttft",
        "0",
        "--out",
        str(out),
        *args,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def token_line(stdout: str) -> str:
    (line,) = [line for line in stdout.splitlines() if line.startswith("token data:")]
    return line


def test_eval_on_the_simulated_model_stores_token_data_a_trainer_batches(tmp_path: Path) -> None:
    result = evaluate(tmp_path / "run")
    assert token_line(result.stdout) == "token data: stored for 6 of 6 rollouts (vllm)"
    table = read_run(tmp_path / "run")
    for name in ("input_ids", "loss_mask", "logprobs", "token_branch", "token_drift"):
        assert table.column(name).null_count == 0, name
    for blob in table.column("trace").to_pylist():  # stored once: in the columns, not in the blob
        assert all(n.token_ids is None and n.logprobs is None for n in decode_trace(blob).nodes)
    for trace, ids, mask, logprobs in zip(
        table_to_traces(table), *(table.column(n).to_pylist() for n in ("input_ids", "loss_mask", "logprobs"))
    ):
        (sequence,) = token_sequences(trace)  # the trace read back keeps its ids
        assert ids == [sequence.input_ids] and mask == [sequence.loss_mask]
        node = trace.nodes[trace.calls[0].node]  # type: ignore[index]
        assert node.token_ids and sum(mask[0]) == len(node.token_ids)  # the completion, EOS included
        sampled = [lp for lp, m in zip(logprobs[0], mask[0]) if m]
        assert all(math.isfinite(lp) and lp <= 0 for lp in sampled) and sampled == pytest.approx(node.logprobs)
    group_id = table.column("group_id")[0].as_py()
    group = table.filter(pc.equal(table["group_id"], group_id))
    batch = Group(group_id, group, group.slice(0, 0)).batch(pad_to=128)
    assert batch["input_ids"].shape == (2, 128) and batch["loss_mask"].sum() == sum(
        sum(m[0]) for m in group.column("loss_mask").to_pylist()
    )
    assert rollout_ray("report", str(tmp_path / "run")).stdout.count("token data: stored for 6 of 6 rollouts\n") == 1


def test_token_capture_off_stores_none_and_says_so(tmp_path: Path) -> None:
    result = evaluate(tmp_path / "run", "--token-capture", "off")
    assert token_line(result.stdout) == "token data: none (--token-capture off)"
    table = read_run(tmp_path / "run")
    assert table.column("input_ids").null_count == table.num_rows == 6
    assert all(trace.nodes[-1].token_ids is None for trace in table_to_traces(table))


class _PlainServer(BaseHTTPRequestHandler):
    """An OpenAI-compatible server with no token ids and no info routes (404); records paths."""

    paths: list[str] = []
    bodies: list[bytes] = []

    def do_GET(self) -> None:
        self.paths.append(self.path)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        self.paths.append(self.path)
        self.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        body = (
            b'{"choices": [{"message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}], '
            b'"usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}'
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def plain_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PlainServer)
    _PlainServer.paths, _PlainServer.bodies = [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_auto_against_a_server_without_token_ids_stores_none_and_asks_nothing_per_call(
    plain_server: str, tmp_path: Path
) -> None:
    result = evaluate(tmp_path / "run", "--model-url", plain_server, "--model", "plain")
    assert token_line(result.stdout) == (
        "token data: none (the server offers no token ids: it answers neither "
        "vLLM's GET /version nor SGLang's GET /get_model_info)"
    )
    assert "rollouts 6  ok 6  failed 0" in result.stdout and "error types  none" in result.stdout
    assert read_run(tmp_path / "run").column("input_ids").null_count == 6
    gets = [p for p in _PlainServer.paths if p in ("/get_model_info", "/version")]
    assert gets == ["/get_model_info", "/version"]  # once per server and process, never per call
    assert len(_PlainServer.bodies) == 6 and all(
        b"return_token_ids" not in b and b"logprobs" not in b for b in _PlainServer.bodies
    )


def test_help_documents_token_capture() -> None:
    result = rollout_ray("eval", "--help")
    assert "--token-capture {auto,vllm,sglang,off}" in result.stdout
    wrong = rollout_ray("eval", ARITH, "--token-capture", "tgi")
    assert wrong.returncode == 2
    assert wrong.stderr.startswith("rollout-ray eval: error: argument --token-capture: invalid choice: 'tgi'")
