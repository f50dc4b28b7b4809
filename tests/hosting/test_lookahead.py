"""Issue 23 §2: the driver tells its executor what comes next (``Executor.prepare``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from rollout_ray import Task
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._hosting.lookahead import lookahead, wanted
from rollout_ray.testing import ScriptedHarness, ScriptedModel


class Shared(Task):
    setup_shareable = True


def test_the_window_is_told_ahead_every_quarter_and_once_more_at_the_end() -> None:
    calls: list[tuple[list[int], list[int]]] = []
    tasks = [Task({"idx": i, "prompt": "p"}) for i in range(10)]

    async def prepare(upcoming: Sequence[Task], admitted: Sequence[Task]) -> None:
        calls.append(([t.data.idx for t in upcoming], [t.data.idx for t in admitted]))

    async def main() -> list[int]:
        return [t.data.idx async for t in lookahead(iter(tasks), 4, prepare, tasks_of=lambda t: [t])]

    assert asyncio.run(main()) == list(range(10))
    assert calls[0] == ([0, 1, 2, 3], [])
    assert calls[1] == ([1, 2, 3, 4], [0])  # every quarter of the window: every admission here
    assert calls[-1] == ([], [6, 7, 8, 9])  # the end: nothing coming, the last ones still starting
    assert len(calls) == 11


def test_a_group_counts_as_its_samples() -> None:
    """The driver plans groups: the window counts their rollouts, not the groups."""
    calls: list[tuple[list[int], list[int]]] = []
    groups = [(i, [Task({"idx": i, "prompt": "p"})] * 3) for i in range(3)]

    async def prepare(upcoming: Sequence[Task], admitted: Sequence[Task]) -> None:
        calls.append(([t.data.idx for t in upcoming], [t.data.idx for t in admitted]))

    async def main() -> list[int]:
        return [g async for g, _ in lookahead(iter(groups), 4, prepare, tasks_of=lambda g: g[1])]

    assert asyncio.run(main()) == [0, 1, 2]
    assert calls == [([0, 0, 0, 1], []), ([1, 1, 1, 2], [0, 0, 0]), ([2, 2, 2], [0, 1, 1, 1]), ([], [1, 2, 2, 2])]


def test_an_executor_that_does_not_look_ahead_has_nothing_read_ahead() -> None:
    """The driver reads one task per group it admits (issue 21) unless its executor uses the
    schedule: then ``max_in_flight`` rollouts' worth more."""
    read: list[int] = []

    def plan() -> Any:
        for i in range(3):
            read.append(i)
            yield i

    async def prepare(upcoming: Sequence[Task], admitted: Sequence[Task]) -> None:
        raise AssertionError("told nothing")

    async def main() -> list[int]:
        seen = []
        async for i in lookahead(plan(), 0, prepare, tasks_of=lambda i: [Task({"prompt": "p"})]):
            seen.append((i, list(read)))
        return seen

    assert asyncio.run(main()) == [(0, [0]), (1, [0, 1]), (2, [0, 1, 2])]


def test_eval_hands_the_driver_its_executor_itself_so_the_schedule_reaches_it(tmp_path: Any, monkeypatch: Any) -> None:
    """``rollout-ray eval`` once wrapped its executor for the progress bar, and the wrapper did
    not pass the schedule on (the CLI's warm pools were never told). The bar now reads the
    driver's progress: the driver gets the executor eval made, nothing in between."""
    import types

    from rollout_ray._cli import drive

    made = Recording()
    seen: list[Any] = []

    class Spy:
        def __init__(self, *args: Any, executor: Any = None, **kwargs: Any) -> None:
            seen.append(executor)
            raise RuntimeError("stop here")

    monkeypatch.setattr(drive, "Driver", Spy)
    with pytest.raises(RuntimeError, match="stop here"):
        asyncio.run(
            drive.drive(
                "t",
                types.ModuleType("t"),
                [Task({"prompt": "p"})],
                ScriptedHarness([]),
                ScriptedModel([]),
                made,
                EvalConfig(),
                str(tmp_path / "run"),
                resume=False,
                where="here",
                manifest_config={},
                announce=False,
            )
        )
    assert seen == [made]


def test_what_a_schedule_asks_of_the_nodes() -> None:
    upcoming = [
        Task({"prompt": "p", "image": "a.tar"}),
        Task({"prompt": "p", "image": "a.tar"}),
        Task({"prompt": "p", "image": "b.tar"}),
        Task({"prompt": "p"}),
        Shared({"prompt": "p", "image": "b.tar"}),
    ]
    admitted = [Shared({"idx": 1, "prompt": "p", "image": "a.tar"}), Shared({"prompt": "no image"})]
    images, setups = wanted(upcoming, admitted)
    assert images == {"a.tar": 2, "b.tar": 2}
    assert setups == {("b.tar", upcoming[4].setup_key), ("a.tar", admitted[0].setup_key)}


class Recording(LocalExecutor):
    def __init__(self) -> None:
        super().__init__(runtime="local")
        self.prepared: list[tuple[int, int, int]] = []
        self.runs = 0

    async def prepare(self, upcoming: Sequence[Task], admitted: Sequence[Task] = ()) -> None:
        self.prepared.append((self.runs, len(upcoming), len(admitted)))

    async def run(self, spec: Any) -> Any:
        self.runs += 1
        return await super().run(spec)


def test_the_driver_tells_its_executor_before_it_admits() -> None:
    executor = Recording()
    tasks = [Task({"idx": i, "prompt": "p"}) for i in range(6)]
    config = EvalConfig(samples_per_task=2, max_in_flight=4)
    result = Driver(tasks, ScriptedHarness(), ScriptedModel(default="x"), executor=executor, config=config).run()
    assert result.samples.num_rows == 12
    assert executor.prepared[0] == (0, 4, 0)  # the first window, before the first rollout ran
    assert executor.prepared[-1][1:] == (0, 4)  # and the end of the schedule
