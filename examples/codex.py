"""Codex CLI, unchanged, on coding tasks: each rollout installs nothing but runs ``codex exec``
(installed once per node from the npm registry, pinned) against the rollout's proxy, which
speaks the Responses API to it. With no real model, the simulated model follows the plan in the
prompt (``RUN:`` / ``WRITE:`` / ``ANSWER:`` lines, ``_simulated/plans.py``) through Codex's
``exec_command`` tool; the reward reads the files Codex left in the sandbox.

    rollout-ray eval examples/codex.py --limit 2
"""

from __future__ import annotations

from rollout_ray import CodexHarness, Runtime, Task, TaskData, reward


class FileData(TaskData):
    name: str
    value: int


class WriteAFile(Task):
    """Compute a value with the shell and leave it in a file, plus a note."""

    data_type = FileData

    @reward
    async def file_written(self, task: FileData, runtime: Runtime) -> float:
        try:
            found = (await runtime.read(f"out/{task.name}.txt")).decode().strip()
            note = (await runtime.read("out/NOTE.md")).decode().strip()
        except Exception:  # noqa: BLE001 - no such file (or unreadable): the agent did not do the work
            return 0.0
        return float(found == str(task.value) and note == f"wrote {task.name}")


def coding_tasks(n: int) -> list[dict[str, object]]:
    rows = []
    for i in range(n):
        name, a, b = f"result{i}", i + 2, 3 * i + 1
        prompt = (
            f"Compute {a} times {b} with the shell and save it in out/{name}.txt, then leave a note.\n"
            f"RUN: mkdir -p out && echo $(({a}*{b})) > out/{name}.txt\n"
            f"WRITE: out/NOTE.md: wrote {name}\n"
            f"ANSWER: saved out/{name}.txt"
        )
        rows.append({"idx": i, "prompt": prompt, "name": name, "value": a * b})
    return rows


def tasks(n: int = 4) -> list[WriteAFile]:
    return [WriteAFile(row) for row in coding_tasks(n)]


def harness() -> CodexHarness:
    return CodexHarness(timeout=300)
