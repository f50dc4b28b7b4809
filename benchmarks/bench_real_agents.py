#!/usr/bin/env python
"""Where does one Codex CLI rollout and one Claude Code rollout go: wall, and CPU split between
the agent's process, the proxy (with the rollout around it) and the model? (issue 29 §3)

Each agent answers "What is 2+2?" once (one model call: its whole prompt, tens of KB, and its
tools through the proxy's Responses or Messages dialect), as a ProgramHarness rollout in a
LocalRuntime, on the simulated model in its own process (``_cost_model.py``, no latency), with
token capture. CPU: the agent from the rollout's child processes (``RUSAGE_CHILDREN``), the
proxy and rollout from this process, the model from its ``/proc`` stat. One warm-up rollout,
then the median of N. The whole benchmark runs in a network namespace of its own (bubblewrap,
loopback only): nothing an agent sends leaves the machine.

    python benchmarks/bench_real_agents.py           # N=5
    python benchmarks/bench_real_agents.py -n 2

The agents run through the package's presets (``CodexHarness``, ``ClaudeCodeHarness``), which
install their pinned npm packages once per node (here, before the namespace is entered).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _proc import TICK, stat_fields  # benchmarks/ is the script's directory, first on the path

from rollout_ray import ClaudeCodeHarness, CodexHarness, LocalRuntime, Rollout, Task
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray._serving.upstream import OpenAIModel

HERE = Path(__file__).resolve().parent
AGENTS = {"codex": CodexHarness, "claude-code": ClaudeCodeHarness}


def cpu_of(pid: int) -> float:
    fields = stat_fields(pid)
    assert fields is not None, "the model server exited"
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Ask(Task):
    """One question, no tools, no rewards."""


async def one(agent: str, model_url: str, model_pid: int) -> dict[str, float]:
    harness = AGENTS[agent](model="simulated", timeout=120)
    model = OpenAIModel(model_url, name="simulated", token_capture="vllm")
    try:
        async with HTTPInterception() as proxy:
            cpu, agent_cpu, model_cpu, wall = time.process_time(), children_cpu(), cpu_of(model_pid), time.time()
            trace = await Rollout(
                Ask({"prompt": "What is 2+2?"}), harness, model=model, interception=proxy, runtime_factory=LocalRuntime
            ).run()
            wall = time.time() - wall
            row = {
                "wall": wall,
                "agent": children_cpu() - agent_cpu,
                "proxy": time.process_time() - cpu,
                "model": cpu_of(model_pid) - model_cpu,
            }
    finally:
        await model.aclose()
    assert trace.ok and trace.last_reply == "4", trace.errors
    return row


async def main(n: int) -> None:
    server = subprocess.Popen(
        [sys.executable, str(HERE / "_cost_model.py"), "--ttft", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[-1]
        print("| agent | wall s | agent CPU s | proxy + rollout CPU s | model CPU s |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for agent in AGENTS:
            await one(agent, url, server.pid)  # warm-up: the binary's pages, the agent's first start
            rows = [await one(agent, url, server.pid) for _ in range(n)]
            cells = [statistics.median(r[k] for r in rows) for k in ("wall", "agent", "proxy", "model")]
            print(f"| {agent} | " + " | ".join(f"{c:.2f}" for c in cells) + " |", flush=True)
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=5)
    parser.add_argument("--isolated", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.isolated:  # installed (once per node) while the registry is reachable, then again isolated
        for preset in AGENTS.values():
            preset().install()
        from rollout_ray._runtimes.sandbox import bwrap_path

        command = [
            bwrap_path(),
            "--dev-bind",
            "/",
            "/",
            "--unshare-net",
            "--",
            sys.executable,
            __file__,
            "-n",
            str(args.n),
            "--isolated",
        ]
        sys.exit(subprocess.run(command).returncode)
    asyncio.run(main(args.n))
