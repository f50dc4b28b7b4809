"""A program-harness taskset as users write it (loader id ``v1-program``): the module pairs
its taskset with its own ``vf.Harness``, whose ``launch`` runs a program in the runtime that
talks to the model at the endpoint it is handed: it asks the row's question, then asks the
answer plus one (two turns); on a row that says "crash" it exits 3 after its first turn."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import verifiers.v1 as vf

PROGRAM = r"""
import json, sys, urllib.request
endpoint, secret, model, prompt = sys.argv[1:5]
def ask(messages):
    body = json.dumps({"model": model, "messages": messages, "temperature": 0}).encode()
    request = urllib.request.Request(endpoint + "/chat/completions", body, {
        "Authorization": "Bearer " + secret, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)["choices"][0]["message"]
messages = [{"role": "user", "content": prompt}]
messages.append(ask(messages))
if "crash" in prompt:
    sys.exit(3)
messages.append({"role": "user", "content": "What is " + messages[-1]["content"] + " + 1?"})
print(ask(messages)["content"])
"""


class TwoStepConfig(vf.HarnessConfig):
    pass


class TwoStep(vf.Harness[TwoStepConfig]):
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data) -> vf.ProgramResult:
        return await runtime.run_program(
            [sys.executable, "-c", PROGRAM, endpoint, secret, ctx.model, str(data.prompt)], {}
        )


class StepData(vf.TaskData):
    answer: int


class StepTask(vf.Task[StepData]):
    @vf.reward
    async def plus_one(self, task: StepData, trace: vf.Trace) -> float:
        return float(trace.last_reply == str(task.answer + 1))


class StepTaskset(vf.Taskset[StepTask]):
    def load(self) -> Iterator[StepTask]:
        for prompt, answer in (("What is 2 + 5?", 7), ("What is 8 + 8?", 17), ("crash: what is 1 + 1?", 2)):
            yield StepTask(StepData(prompt=prompt, answer=answer), self.config.task)


__all__ = ["StepTaskset", "TwoStep"]
