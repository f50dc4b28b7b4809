#!/usr/bin/env python
"""What does token capture cost per model call, at 1,000-token completions?

An upstream in its own process answers every chat completion with a fresh random 1,000-token
reply (a 200-token prompt) in the shape the request asks for: vLLM's or SGLang's token
capture (ids, one log-probability per token) or the plain OpenAI shape, JSON or SSE (one
chunk per token, as vLLM streams). Its CPU is not counted. In this process:

* ``upstream`` rows: ``OpenAIModel.complete`` alone (encode the request, read and parse the
  answer), CPU ms per call.
* ``proxy`` rows: a harness's HTTP request through ``HTTPInterception`` → ``RolloutSession``
  → ``OpenAIModel`` → upstream and back (the harness's client is in this process too, the
  same for every row), CPU ms per call, and the size of the rollout's trace: the msgpack
  ``trace`` column, and a Parquet shard (zstd, as the run store writes it) per record.

    python benchmarks/bench_token_capture.py            # 300 calls per row
    python benchmarks/bench_token_capture.py --quick    # 60 calls per row
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass

import aiohttp
import msgspec
import pyarrow.parquet as pq
from aiohttp import web

from rollout_ray import RolloutSession, Trace, TraceTask
from rollout_ray._core.model import SESSION_ID
from rollout_ray._record.arrow import RolloutRecord, records_to_table
from rollout_ray._record.messages import Request, UserMessage
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.completion import Choice
from rollout_ray._simulated.dialects import sglang_completion, vllm_completion, vllm_events
from rollout_ray._simulated.logprobs import Scored
from rollout_ray._simulated.request import Capture
from rollout_ray._simulated.tokenizer import IM_END, encode

COMPLETION_TOKENS = 1000
PROMPT_TOKENS = 200
QUESTION = "Tell me a long story."
_encode = msgspec.json.Encoder().encode


# -- the upstream (its own process) ---------------------------------------------------------


def _reply(seed: int = 0) -> tuple[Choice, list[int]]:
    rng = random.Random(seed)
    text = "".join(rng.choice("abcdefghij klmnopqrst uvwxyz.") for _ in range(4 * (COMPLETION_TOKENS - 1)))
    ids = [*encode(text)][: COMPLETION_TOKENS - 1] + [IM_END]
    scored = tuple(Scored(t, -rng.random(), ((t, -0.1),)) for t in ids)
    choice = Choice(0, {"role": "assistant", "content": text}, "stop", len(ids), tuple(ids), scored)
    prompt = [rng.randrange(16, 60000) for _ in range(PROMPT_TOKENS)]
    return choice, prompt


def _answer(seed: int, shape: str, logprobs: bool, stream: bool) -> bytes:
    """A fresh answer in ``shape`` (``plain``, ``vllm`` or ``sglang``), JSON or SSE."""
    choice, prompt = _reply(seed)
    head = {"id": f"chatcmpl-{seed}", "created": 0, "model": "bench"}
    usage = {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": COMPLETION_TOKENS,
        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
    }
    capture = Capture(
        "sglang" if shape == "sglang" else "vllm",
        token_ids=shape != "plain",
        prompt_ids=shape == "sglang",
        logprobs=logprobs or shape != "plain",
    )
    if stream:  # SGLang refuses token ids on a stream: only vLLM's chunks are asked for
        events = vllm_events(head, [choice], prompt, usage, capture, 0.0, 0.0)
        return b"".join(b"data: " + _encode(e) + b"\n\n" for _, e in events) + b"data: [DONE]\n\n"
    if shape == "sglang":
        return _encode(sglang_completion(head, [choice], prompt, usage, capture, 0, 0.0))
    return _encode(vllm_completion(head, [choice], prompt, usage, capture))


async def _serve() -> None:
    served = 0

    async def chat(request: web.Request) -> web.StreamResponse:
        nonlocal served
        body = msgspec.json.decode(await request.read())
        shape = "plain"
        if body.get("return_token_ids"):
            shape = "sglang" if body.get("return_prompt_token_ids") else "vllm"
        stream = bool(body.get("stream"))
        served += 1
        payload = _answer(served, shape, bool(body.get("logprobs")), stream)
        kind = "text/event-stream" if stream else "application/json"
        return web.Response(body=payload, content_type=kind, headers={"X-Policy-Version": "1"})

    app = web.Application(client_max_size=1 << 26)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(runner.addresses[0][1], flush=True)
    await asyncio.Event().wait()


# -- the measurements -----------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    path: str
    capture: str
    upstream: str
    agent_logprobs: bool
    cpu_ms: float
    trace_bytes: float | None = None
    parquet_bytes: float | None = None


async def _upstream_row(url: str, capture: str | None, stream: bool, logprobs: bool, calls: int) -> Row:
    model = OpenAIModel(url, name="bench", token_capture=capture, stream=stream)  # type: ignore[arg-type]
    request = Request([UserMessage(QUESTION)])
    sampling = {"logprobs": True} if logprobs else {}
    SESSION_ID.set("bench-session")
    for _ in range(5):  # warm the pool and the code paths
        await model.complete(request, model=None, sampling=sampling)
    cpu = time.process_time()
    for _ in range(calls):
        response = await model.complete(request, model=None, sampling=sampling)
    cpu = time.process_time() - cpu
    await model.aclose()
    assert (response.token_ids is not None) == (capture is not None)
    return Row("upstream", capture or "off", "sse" if stream else "json", logprobs, 1e3 * cpu / calls)


async def _proxy_row(url: str, capture: str | None, stream: bool, logprobs: bool, calls: int) -> Row:
    model = OpenAIModel(url, name="bench", token_capture=capture, stream=stream)  # type: ignore[arg-type]
    body = _encode({"messages": [{"role": "user", "content": QUESTION}], **({"logprobs": True} if logprobs else {})})
    traces: list[Trace] = []
    async with HTTPInterception() as proxy, aiohttp.ClientSession() as client:

        async def one() -> None:
            session = RolloutSession(Trace(task=TraceTask(type="bench")), model)
            async with proxy.serve(session) as slot:
                headers = {"Authorization": f"Bearer {slot.model_secret}", "Content-Type": "application/json"}
                async with client.post(f"{slot.base_url}/v1/chat/completions", data=body, headers=headers) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()
            traces.append(session.trace)

        for _ in range(5):
            await one()
        traces.clear()
        cpu = time.process_time()
        for _ in range(calls):
            await one()
        cpu = time.process_time() - cpu
    await model.aclose()
    trace_bytes = sum(len(msgspec.msgpack.encode(t)) for t in traces) / len(traces)
    return Row(
        "proxy",
        capture or "off",
        "sse" if stream else "json",
        logprobs,
        1e3 * cpu / calls,
        trace_bytes,
        _parquet_bytes(traces),
    )


def _parquet_bytes(traces: list[Trace]) -> float:
    records = [RolloutRecord(t, "bench", f"g{i}", 0) for i, t in enumerate(traces)]
    sink = io.BytesIO()
    pq.write_table(records_to_table(records), sink, compression="zstd", write_page_checksum=True, row_group_size=1000)
    return len(sink.getvalue()) / len(traces)


CASES = [
    (None, False, False),
    ("vllm", False, False),
    ("sglang", False, False),
    (None, True, False),
    ("vllm", True, False),
    (None, False, True),
    ("vllm", False, True),
    ("sglang", False, True),
]
"""``(capture, upstream stream, harness asks logprobs)``."""


async def _measure(url: str, calls: int) -> list[Row]:
    rows = []
    for capture, stream, logprobs in CASES:
        rows.append(await _upstream_row(url, capture, stream, logprobs, calls))
    for capture, stream, logprobs in CASES:
        rows.append(await _proxy_row(url, capture, stream, logprobs, calls))
    return rows


def _table(rows: list[Row]) -> str:
    base = {(r.path, r.upstream, r.agent_logprobs): r for r in rows if r.capture == "off"}
    header = (
        f"{'path':8}  {'capture':7}  {'upstream':8}  {'harness logprobs':16}  {'CPU ms/call':>11}  "
        f"{'vs off':>7}  {'trace B':>8}  {'parquet B':>9}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        off = base[r.path, "json" if r.capture == "sglang" else r.upstream, r.agent_logprobs]
        delta = "" if r is off else f"{r.cpu_ms - off.cpu_ms:+.2f}"
        sizes = f"{r.trace_bytes:8.0f}  {r.parquet_bytes:9.0f}" if r.trace_bytes is not None else f"{'':8}  {'':9}"
        upstream = "json*" if r.capture == "sglang" and r.upstream == "sse" else r.upstream
        lines.append(
            f"{r.path:8}  {r.capture:7}  {upstream:8}  {r.agent_logprobs!s:16}  {r.cpu_ms:11.2f}  {delta:>7}  {sizes}"
        )
    lines.append("* SGLang refuses token ids on a stream: with capture the call is made without streaming.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="model calls per row")
    parser.add_argument("--quick", action="store_true", help="60 calls per row")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve())
        return
    calls = 60 if args.quick else args.calls
    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        rows = asyncio.run(_measure(f"http://127.0.0.1:{port}/v1", calls))
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(
        f"token capture, {COMPLETION_TOKENS}-token completions, {PROMPT_TOKENS}-token prompts, "
        f"{calls} calls per row, cpus={os.cpu_count()}"
    )
    print(_table(rows))


if __name__ == "__main__":
    main()
