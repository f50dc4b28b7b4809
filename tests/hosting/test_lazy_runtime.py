"""LazyRuntime: the one mechanism that starts an owned runtime on its first use, for every
executor, including a copy handed to another process (no Ray)."""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence

from rollout_ray import ProgramResult, Runtime
from rollout_ray._hosting.lazy_runtime import LazyRuntime

from conftest import run

EVENTS: list[tuple[str, str]] = []
"""What every ``Recorded`` runtime did, copies included (they share the runtime's name)."""


class Recorded(Runtime):
    """A picklable runtime that records its starts, stops and policies by name, as a runtime
    actor would see the calls of every copy of a ``RemoteRuntime``."""

    type = "recorded"

    async def _start(self) -> None:
        EVENTS.append(("start", self.name))

    async def _teardown(self) -> None:
        EVENTS.append(("stop", self.name))

    async def prepare_execution(self, routes: Sequence[str] | None) -> None:
        EVENTS.append(("routes", ",".join(routes or ())))

    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_output: int = 0,
        stdin: bytes | None = None,
    ) -> ProgramResult:
        EVENTS.append(("exec", " ".join(argv)))
        return ProgramResult(0)

    async def read(self, path: str, max_bytes: int | None = None) -> bytes:
        return b""

    async def write(self, path: str, data: bytes | str) -> None:
        pass


def lifecycle(*uses: str, hand_on: bool = False) -> list[tuple[str, str]]:
    """Start a lazy runtime as ``Rollout.open`` does, use it (``here`` in this process,
    ``there`` in a pickled copy), then stop it; what the runtime saw."""
    EVENTS.clear()

    async def main() -> None:
        lazy = LazyRuntime(Recorded("box"))
        await lazy.start()
        await lazy.prepare_execution(["http://proxy"])
        copy = pickle.loads(pickle.dumps(lazy)) if hand_on else None
        for use in uses:
            await (lazy if use == "here" else copy).exec(["true"])  # type: ignore[union-attr]
        await lazy.stop()

    run(main())
    return list(EVENTS)


def test_an_unused_runtime_is_never_started_nor_stopped() -> None:
    assert lifecycle() == []


def test_the_first_use_starts_it_with_the_routes_it_was_given() -> None:
    assert lifecycle("here", "here") == [
        ("start", "box"),
        ("routes", "http://proxy"),
        ("exec", "true"),
        ("exec", "true"),
        ("stop", "box"),
    ]


def test_a_copy_used_elsewhere_starts_the_runtime_and_the_original_stops_it() -> None:
    """A tool server in another process used the box: its owner still tears it down."""
    assert lifecycle("there", hand_on=True) == [
        ("start", "box"),
        ("routes", "http://proxy"),
        ("exec", "true"),
        ("stop", "box"),
    ]


def test_a_copy_handed_on_but_never_used_is_still_stopped_by_its_owner() -> None:
    """The owner cannot know the copy stayed unused: its teardown reaches the runtime anyway."""
    assert lifecycle(hand_on=True) == [("stop", "box")]
