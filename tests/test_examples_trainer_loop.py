"""examples/trainer_loop.py: groups streamed into batches, weight updates in a pause, staleness
drops reported (issue 12, "Done when"); with interrupt, admission and the keep rule (issue 22)."""

from __future__ import annotations

import asyncio
import importlib.util
import pathlib
import re
import subprocess
import sys
from typing import Any

EXAMPLE = pathlib.Path(__file__).parents[1] / "examples" / "trainer_loop.py"


def example() -> Any:
    spec = importlib.util.spec_from_file_location("trainer_loop_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


def test_every_group_carries_signal_within_max_staleness_and_none_is_rerun() -> None:
    report = asyncio.run(example().main(groups=16, samples=4, update_every=2, max_staleness=2, quiet=True))
    assert (report.steps, report.rows, report.updates) == (16, 64, 8)
    assert all(shape[0] == 4 and shape[1] > 0 for shape in report.shapes) and report.trained_tokens > 0
    assert all(now - oldest <= 2 for now, versions in report.versions for oldest in versions)
    assert report.versions[-1][0] == 7  # the version when the last group arrived
    assert all(std > 0 for std in report.stds)  # the keep rule streams only groups with signal


def test_max_staleness_0_hands_on_only_groups_of_the_current_version() -> None:
    report = asyncio.run(example().main(groups=8, samples=4, update_every=2, max_staleness=0, quiet=True))
    assert report.steps == 8 and report.updates == 4 and report.stale == 0
    assert all(versions == [now] * 4 for now, versions in report.versions)


def test_it_runs_as_a_script_and_reports_what_it_saw() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120, cwd=EXAMPLE.parents[1]
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.match(r"step  1 group \d+-", lines[0]) and "sampled tokens, mean old logprob" in lines[0]
    assert re.fullmatch(
        r"16 groups, 64 sequences, \d+ sampled tokens, 8 weight updates; \d+ samples continued "
        r"across an update; admission held \d+ groups, \d+ rollouts re-run as stale "
        r"\(max_staleness=2\); \d+ groups without signal not streamed",
        lines[-1],
    ), lines[-1]
    assert "weights updated: policy version 8" in done.stdout
