"""Per-task timeouts as users write them (loader id ``v1-slow``): the harness's program asks
the model once, then hangs (a ``sleep``) on rows that say "hang"; those rows give the agent
one second (``TaskTimeout(agent=1)``), the others their default."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import verifiers.v1 as vf

PROGRAM = r"""
import json, sys, time, urllib.request
endpoint, secret, model, prompt = sys.argv[1:5]
body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0}).encode()
request = urllib.request.Request(endpoint + "/chat/completions", body, {
    "Authorization": "Bearer " + secret, "Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=60) as answer:
    print(json.load(answer)["choices"][0]["message"]["content"])
if "hang" in prompt:
    time.sleep(120)
"""


class OnceConfig(vf.HarnessConfig):
    pass


class Once(vf.Harness[OnceConfig]):
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data) -> vf.ProgramResult:
        return await runtime.run_program(
            [sys.executable, "-c", PROGRAM, endpoint, secret, ctx.model, str(data.prompt)], {}
        )


class SlowTask(vf.Task):
    @vf.reward
    async def replied(self, trace: vf.Trace) -> float:
        return float(bool(trace.last_reply))


class SlowTaskset(vf.Taskset[SlowTask]):
    def load(self) -> Iterator[SlowTask]:
        yield SlowTask(vf.TaskData(prompt="What is 1 + 2?"), self.config.task)
        yield SlowTask(vf.TaskData(prompt="hang: what is 2 + 2?", timeout=vf.TaskTimeout(agent=1)), self.config.task)


__all__ = ["SlowTaskset", "Once"]
