"""A taskset that uses the runtime as users write it (loader id ``v1-box``): ``setup``
writes the expected answer into the box, ``finalize`` runs a program there, a reward and a
metric read what they left. Row 1's file holds a wrong answer, so rewards differ."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf


class BoxTask(vf.Task):
    async def setup(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        a, b = (int(x) for x in str(self.data.prompt).removeprefix("What is ").removesuffix("?").split(" + "))
        await runtime.write("expected.txt", str(a + b + (a == 4)).encode())

    async def finalize(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        result = await runtime.run(
            ["sh", "-c", 'printf %s "$REPLY" > reply.txt && wc -c < reply.txt'], {"REPLY": trace.last_reply}
        )
        assert result.exit_code == 0, result.stderr
        await runtime.write("reply_bytes.txt", result.stdout.strip().encode())

    @vf.reward
    async def matches_file(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        return float((await runtime.read("expected.txt")).decode() == trace.last_reply)

    @vf.metric
    async def reply_bytes(self, runtime: vf.Runtime) -> float:
        return float((await runtime.read("reply_bytes.txt")).decode())


class BoxTaskset(vf.Taskset[BoxTask]):
    def load(self) -> Iterator[BoxTask]:
        for a, b in ((1, 2), (4, 40), (30, 3)):
            yield BoxTask(vf.TaskData(prompt=f"What is {a} + {b}?"), self.config.task)


__all__ = ["BoxTaskset"]
