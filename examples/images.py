"""Tasks that bring their own system: two images, an agent program running inside them, a setup
run once per group, and a grader's file the agent never sees.

    python examples/build_images.py          # the images, from Debian's packages (nothing committed)
    rollout-ray eval examples/images.py      # 4 samples a task: one setup per group and node

* ``Sum`` runs over ``python.tar`` (busybox and Debian's Python): the agent program
  (``agent_program.py``, standard library only) runs on the image's Python, not the host's.
* ``Ledger`` runs over ``python-jq`` (the same, and ``jq``). Its setup writes the ledger the
  question is about with ``jq``, which the other image lacks (the ``has_jq`` metric shows it);
  the setup does not depend on the sample (``setup_shareable``), so the first sample of a
  group on a node runs it and the others start from its snapshot (``setup_shared``: 1.0).
* Both are scored against ``/.grader/answer`` (``grader_files``): it enters the box after the
  agent's processes are gone, read-only, and a fresh exec reads it.

``ROLLOUT_RAY_EXAMPLE_IMAGES`` says where the images are (default
``~/.cache/rollout-ray/example-images``). Each trace names the image it ran over
(``agent.runtime.image``) and the setup snapshot it started from (``agent.runtime.snapshot``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from rollout_ray import EvalConfig, ProgramHarness, Runtime, Task, TaskData, Trace, metric, reward

IMAGES = Path(os.environ.get("ROLLOUT_RAY_EXAMPLE_IMAGES") or Path.home() / ".cache" / "rollout-ray" / "example-images")
AGENT = Path(__file__).resolve().parent / "agent_program.py"


class SumData(TaskData):
    a: int
    b: int


class Sum(Task):
    data_type = SumData

    def grader_files(self) -> Mapping[str, str]:
        data = self.data
        assert isinstance(data, SumData)
        return {"answer": str(data.a + data.b)}

    @reward
    async def correct(self, trace: Trace, runtime: Runtime) -> float:
        hidden = await runtime.exec(["cat", f"{runtime.grader_dir}/answer"])
        return float(hidden.exit_code == 0 and trace.last_reply.strip() == hidden.stdout.strip())

    @metric
    async def has_jq(self, runtime: Runtime) -> float:
        return float((await runtime.exec(["sh", "-c", "command -v jq"])).exit_code == 0)

    @metric
    def setup_shared(self, trace: Trace) -> float:
        return float(trace.agent.runtime is not None and trace.agent.runtime.snapshot is not None)


class Ledger(Sum):
    setup_shareable = True

    async def setup(self, runtime: Runtime) -> None:
        data = self.data
        assert isinstance(data, SumData)
        made = await runtime.exec(["sh", "-c", f"jq -n '{{items: [{data.a}, {data.b}]}}' > /work/ledger.json"])
        if made.exit_code != 0:
            raise RuntimeError(f"writing the ledger failed: {made.stderr.strip()}")

    @metric
    async def ledger_total(self, runtime: Runtime) -> float:
        total = await runtime.exec(["jq", ".items | add", "/work/ledger.json"])
        return float(total.stdout.strip() or "nan")


def tasks(n: int = 4) -> list[Sum]:
    missing = [p for p in (IMAGES / "python.tar", IMAGES / "python-jq" / "index.json") if not p.exists()]
    if missing:
        raise FileNotFoundError(
            f"no image at {missing[0]}: build them with python examples/build_images.py "
            f"(or set ROLLOUT_RAY_EXAMPLE_IMAGES)"
        )
    out: list[Sum] = []
    for idx in range(n):
        a, b = 10 + 7 * idx, 3 + 5 * idx
        kind, image = (Sum, IMAGES / "python.tar") if idx % 2 == 0 else (Ledger, IMAGES / "python-jq")
        out.append(kind({"idx": idx, "prompt": f"What is {a} + {b}?", "a": a, "b": b, "image": str(image)}))
    return out


def harness() -> ProgramHarness:
    return ProgramHarness(["python3", "agent_program.py"], files={"agent_program.py": AGENT.read_text()}, timeout=120)


config = EvalConfig(samples_per_task=4)
