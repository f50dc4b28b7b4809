#!/usr/bin/env python
"""What does a dialect cost at the proxy, beside Chat Completions? (Target: at most 1.5x.)

The same agent turn, spoken in each dialect: a coding agent's eleventh call (2 KB of
instructions, three function tools, five earlier turns of a tool call and its 400-character
result), answered with a tool call. The proxy and the session run in this process over an
in-process model (``ScriptedModel``: no upstream I/O, so the proxy's own work is what
differs); the agent is a client in its own process (its CPU is not counted), one request at a
time on a keep-alive connection. A fresh rollout per row; 100 warm-up calls, then CPU-us of
this process per call.

    python benchmarks/bench_dialects.py             # 2,000 calls per row, 3 rounds
    python benchmarks/bench_dialects.py --quick     # 300 calls per row, 1 round
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from rollout_ray import RolloutSession, Trace, TraceTask
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray.testing import Reply, ScriptedModel

WARMUP = 100
INSTRUCTIONS = "You are a coding agent. Follow the repository's conventions. " * 34
SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
    "required": ["command"],
}
TOOLS = [("shell", "Run a shell command."), ("read_file", "Read a file."), ("write_file", "Write a file.")]
TURNS = [
    (
        f"Step {i}: looking.",
        f"call_{i}",
        {"command": f"grep -rn pattern_{i} src/ | head -20"},
        f"src/module_{i}.py:{i}: " + "x" * 400,
    )
    for i in range(5)
]
PROMPT = "Fix the failing test in tests/test_parser.py."


def chat_body() -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": PROMPT}]
    for text, call_id, args, result in TURNS:
        messages += [
            {
                "role": "assistant",
                "content": text,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "shell", "arguments": json.dumps(args)}}
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": result},
        ]
    tools = [{"type": "function", "function": {"name": n, "description": d, "parameters": SCHEMA}} for n, d in TOOLS]
    return {"model": "m", "messages": messages, "tools": tools, "max_tokens": 512}


def responses_body() -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]}
    ]
    for i, (text, call_id, args, result) in enumerate(TURNS):
        items += [
            {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{i}",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            },
            {
                "type": "function_call",
                "id": f"fc_{i}",
                "call_id": call_id,
                "name": "shell",
                "arguments": json.dumps(args),
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": call_id, "output": result},
        ]
    tools = [{"type": "function", "name": n, "description": d, "parameters": SCHEMA, "strict": False} for n, d in TOOLS]
    return {
        "model": "m",
        "instructions": INSTRUCTIONS,
        "input": items,
        "tools": tools,
        "max_output_tokens": 512,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "store": False,
    }


def messages_body() -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
    for text, call_id, args, result in TURNS:
        messages += [
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": text},
                    {"type": "tool_use", "id": call_id, "name": "shell", "input": args},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": result}]},
        ]
    tools = [{"name": n, "description": d, "input_schema": SCHEMA} for n, d in TOOLS]
    return {"model": "m", "system": INSTRUCTIONS, "messages": messages, "tools": tools, "max_tokens": 512}


ROWS = {
    "chat": ("/v1/chat/completions", chat_body),
    "responses": ("/v1/responses", responses_body),
    "messages": ("/v1/messages", messages_body),
}

CLIENT = """
import sys, asyncio, aiohttp
url, secret, n, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
body = sys.stdin.buffer.readline()
async def main():
    headers = {"Authorization": "Bearer " + secret, "x-api-key": secret, "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as client:
        async def call():
            async with client.post(url, data=body, headers=headers) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
        for _ in range(warmup):
            await call()
        print("warm", flush=True)
        sys.stdin.readline()
        for _ in range(n):
            await call()
        print("done", flush=True)
asyncio.run(main())
"""


async def row(proxy: HTTPInterception, path: str, body: dict[str, Any], n: int) -> float:
    """CPU-us of this process per call."""
    model = ScriptedModel(default=Reply("Running it.", tool_calls=[("shell", {"command": "pytest -x"})]))
    session = RolloutSession(Trace(task=TraceTask(type="T")), model)
    async with proxy.serve(session) as slot:
        client = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CLIENT,
            slot.base_url + path,
            slot.model_secret,
            str(n),
            str(WARMUP),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert client.stdin is not None and client.stdout is not None
        client.stdin.write(json.dumps(body).encode() + b"\n")
        assert await asyncio.wait_for(client.stdout.readline(), 300) == b"warm\n"
        start = time.process_time()
        client.stdin.write(b"go\n")
        assert await asyncio.wait_for(client.stdout.readline(), 600) == b"done\n"
        cpu = time.process_time() - start
        await client.wait()
    return cpu / n * 1e6


async def main(n: int, rounds: int) -> None:
    results: dict[tuple[str, bool], list[float]] = {}
    async with HTTPInterception(max_body=64 << 20) as proxy:
        for _ in range(rounds):  # rounds interleave the rows, so load drifts touch all alike
            for name, (path, build) in ROWS.items():
                for stream in (False, True):
                    body = {**build(), "stream": stream}
                    results.setdefault((name, stream), []).append(await row(proxy, path, body, n))
    print(f"| dialect | answer | proxy CPU-us per call (median of {rounds}) | x Chat Completions |")
    print("| --- | --- | ---: | ---: |")
    for (name, stream), values in results.items():
        base = statistics.median(results[("chat", stream)])
        value = statistics.median(values)
        print(f"| {name} | {'SSE' if stream else 'JSON'} | {value:.0f} | {value / base:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(300 if args.quick else 2000, 1 if args.quick else 3))
