"""The walk of one rollout (docs/architecture.md, "Following one rollout") is counted, not told.

One ``ChatHarness`` rollout runs through a ``Driver`` on a ``RayExecutor`` against a real
simulated model server, with a profiler in the driver and in the rollout actor's process
(started by ``walk_site/sitecustomize.py`` there). It records every ``rollout_ray`` file a function of
which runs on the rollout's way: on the driver's side, under ``run_attempts`` and in the tasks
started there (the channel's sender and collector); on the actor's side, under
``RunReceiver.submit`` and in the tasks started there (the rollout's own). The files traced
must be exactly those the doc names: its table (the files that move the rollout on) and its
list of the records and helpers the walk crosses; and the counts its text states must be theirs.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from walk_tracer import OUT_ENV, Tracer

from rollout_ray import ChatHarness, OpenAIModel, SimulatedModelServer
from rollout_ray._driver.driver import Driver, EvalConfig

from conftest import tasks

DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


def _files(cell: str) -> list[str]:
    """The files of a doc cell, relative to the package: a name starting with ``_`` is a path
    from the package (`_core/a.py`, `_errors.py`), any other one is in the folder of the path
    before it (`_core/a.py`, `b.py` is _core/a.py and _core/b.py)."""
    files, folder = [], ""
    for name in re.findall(r"`([^`]+\.py)`", cell):
        if name.startswith("_"):
            folder = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
            files.append(name)
        else:
            files.append(folder + name)
    return files


def documented_walk(text: str) -> tuple[list[str], list[str], dict[str, int], dict[str, list[str]]]:
    """The doc's walk: the table's files, the records and helpers listed after it, the
    counts its text states ("N files move the rollout on", "the walk crosses M files") and
    the run stack of each side (a line "- driver: `file:function` → ...")."""
    section = text.split("## Following one rollout", 1)[1].split("\n## ", 1)[0]
    movers = [f for line in section.splitlines() if re.match(r"\| \d+ \|", line) for f in _files(line.split("|")[2])]
    helpers_line = next(line for line in section.splitlines() if line.startswith("Records and helpers on the way:"))
    counts = {
        "movers": int(re.search(r"(\d+) files move the rollout on", section).group(1)),  # type: ignore[union-attr]
        "walk": int(re.search(r"the walk crosses (\d+) files", section).group(1)),
    }  # type: ignore[union-attr]
    stacks = {
        m.group(1): re.findall(r"`([^`]+:[^`]+)`", m.group(2))
        for m in re.finditer(r"^- (driver|actor): (.*)$", section, re.MULTILINE)
    }
    return movers, _files(helpers_line), counts, stacks


@pytest.mark.ray
def test_the_documented_walk_is_the_traced_one(ray_cluster: Any, tmp_path: Path) -> None:
    from rollout_ray._ray.ray_executor import RayExecutor

    out = tmp_path / "walk"
    # The actor's process starts its profiler (walk_site/sitecustomize.py) before any of its code.
    site = os.pathsep.join(p for p in (str(Path(__file__).parent / "walk_site"), os.environ.get("PYTHONPATH")) if p)
    env = {"env_vars": {OUT_ENV: str(out), "PYTHONPATH": site}}
    driver_files: set[str] = set()
    driver_stacks: list[list[str]] = []

    async def main() -> Any:
        async with SimulatedModelServer() as server:
            model = OpenAIModel(server.base_url)  # type: ignore[arg-type]
            async with RayExecutor(
                actors=1, capacity=1, runtime="local", actor_options={"runtime_env": env}
            ) as executor:
                driver = Driver(
                    tasks(1), ChatHarness(), model, executor=executor, config=EvalConfig(samples_per_task=1)
                )
                tracer = Tracer(driver_files.add, driver_stacks.append)
                sys.setprofile(tracer)
                threading.setprofile(tracer)
                try:
                    result = await driver.arun()
                finally:
                    sys.setprofile(None)
                    threading.setprofile(None)  # type: ignore[arg-type]
            await model.aclose()
            return result

    result = asyncio.run(main())
    assert result.status == "completed" and result.samples.num_rows == 1
    lines = [line for p in tmp_path.glob("walk.*") for line in p.read_text().splitlines()]
    actor_files = {line for line in lines if not line.startswith("stack ")}
    actor_stacks = [line.split()[1:] for line in lines if line.startswith("stack ")]
    assert "_core/rollout.py" in actor_files, f"the actor's tracer saw no rollout: {sorted(actor_files)}"
    traced = driver_files | actor_files

    movers, helpers, counts, stacks = documented_walk(DOC.read_text())
    documented = set(movers) | set(helpers)
    assert len(movers) == len(set(movers)) and not set(movers) & set(helpers), "a file named twice in the doc"
    assert traced == documented, (
        f"docs/architecture.md's walk is not the traced one: "
        f"not in the doc {sorted(traced - documented)}, "
        f"not on the walk {sorted(documented - traced)}"
    )
    assert stacks == {"driver": driver_stacks[0], "actor": actor_stacks[0]}, (
        f"docs/architecture.md's run stacks {stacks}; traced: driver {driver_stacks}, actor {actor_stacks}"
    )
    assert counts == {"movers": len(movers), "walk": len(documented)}, (
        f"the doc's counts {counts}; traced: {len(movers)} that move the rollout on, {len(documented)} in all"
    )
