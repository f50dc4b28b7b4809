"""Issue 23 §3: setup once per group — a shareable setup runs in one sample's sandbox, is frozen,
and the group's other samples start from it (copy on write); the trace names the snapshot."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from image_rig import needs_image, python_image, shared_cache

from rollout_ray import RolloutSpec, RolloutTimeouts, Task, Trace
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._runtimes import image_cache
from rollout_ray.testing import ScriptedHarness, ScriptedModel

pytestmark = needs_image

SETUP = (
    "mkdir -p /work/repo && echo built > /work/repo/state && rm /bin/ls "
    "&& rm -rf /usr/share/doc && mkdir /usr/share/doc && echo mine > /usr/share/doc/only"
)
LOOK = "cat /work/repo/state; test -e /bin/ls || echo no-ls; ls /usr/share/doc; echo private > /work/$1; ls /work"


@pytest.fixture
def node_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Executors use the node's default cache: here, the tests' one, with no snapshot left."""
    monkeypatch.setenv("ROLLOUT_RAY_IMAGE_CACHE", shared_cache().root)
    image_cache.default_image_cache.cache_clear()
    store = image_cache.default_image_cache().snapshots
    yield store
    image_cache.default_image_cache.cache_clear()
    assert os.listdir(store._dir("entries")) == [], "a snapshot outlived its owner and users"


class SharedSetup(Task):
    """Counts its setup's executions in this process (the local executor runs it here)."""

    setup_shareable = True
    runs: ClassVar[int] = 0
    seen: ClassVar[dict[str, str]] = {}
    fail_first: ClassVar[bool] = False

    async def setup(self, runtime: Any) -> None:
        type(self).runs += 1
        if type(self).fail_first and type(self).runs == 1:
            raise RuntimeError("setup failed once")
        result = await runtime.exec(["sh", "-c", SETUP])
        assert result.exit_code == 0, result.stderr

    async def finalize(self, trace: Trace, runtime: Any) -> None:
        result = await runtime.exec(["sh", "-c", LOOK, "sh", f"mine-{trace.id}"])
        type(self).seen[trace.id] = result.stdout


def group(task: Task, n: int) -> list[Trace]:
    async def main() -> list[Trace]:
        async with LocalExecutor(runtime="sandbox") as executor:
            specs = [RolloutSpec(task, ScriptedHarness(in_process=True), ScriptedModel(default="ok")) for _ in range(n)]
            return list(await asyncio.gather(*(executor.run(s) for s in specs)))

    return asyncio.run(main())


@pytest.fixture
def counted() -> Iterator[type[SharedSetup]]:
    SharedSetup.runs, SharedSetup.seen, SharedSetup.fail_first = 0, {}, False
    yield SharedSetup


def test_a_group_of_eight_runs_its_shared_setup_once(node_cache: Any, counted: type[SharedSetup]) -> None:
    """Counted executions, not time: one setup for 8 samples; each starts where it left off
    (its files, a removed file, a replaced directory), writes only to its own layer, and its
    trace names the snapshot; the one that ran it names none."""
    traces = group(counted({"prompt": "hi", "image": python_image()}), 8)
    assert [t.errors for t in traces] == [[]] * 8 and counted.runs == 1
    for trace in traces:
        assert counted.seen[trace.id] == f"built\nno-ls\nonly\nmine-{trace.id}\nrepo\n"
    snapshots = [t.agent.runtime.snapshot for t in traces if t.agent.runtime is not None]
    assert len(snapshots) == 8 and snapshots.count(None) == 1
    assert len({s for s in snapshots if s is not None}) == 1
    assert {t.agent.runtime.image for t in traces if t.agent.runtime is not None} == {
        shared_cache().lease(python_image()).key
    }


def test_a_failed_shared_setup_is_run_again_by_the_next_sample(node_cache: Any, counted: type[SharedSetup]) -> None:
    counted.fail_first = True
    traces = group(counted({"prompt": "hi", "image": python_image()}), 4)
    failed = [t for t in traces if not t.ok]
    assert len(failed) == 1 and failed[0].errors[0].message == "task setup failed: RuntimeError: setup failed once"
    assert counted.runs == 2  # the failed one, then the one that froze it for the other two
    assert sorted(str(t.agent.runtime.snapshot is None) for t in traces if t.ok) == ["False", "False", "True"]


def test_a_shareable_setup_over_the_hosts_system_runs_per_sample(counted: type[SharedSetup]) -> None:
    """Only image sandboxes share a setup (their writable layer is a directory to freeze)."""

    class Plain(SharedSetup):
        async def setup(self, runtime: Any) -> None:
            type(self).runs += 1

        async def finalize(self, trace: Trace, runtime: Any) -> None:
            pass

    traces = group(Plain({"prompt": "hi"}), 3)
    assert [t.ok for t in traces] == [True] * 3 and Plain.runs == 3
    assert [t.agent.runtime.snapshot for t in traces if t.agent.runtime is not None] == [None] * 3


class SlowSetup(Task):
    setup_shareable = True

    async def setup(self, runtime: Any) -> None:
        await runtime.exec(["sh", "-c", "sleep 30"])


def test_a_sample_waiting_for_its_groups_setup_is_bound_by_its_setup_timeout(node_cache: Any) -> None:
    """The wait for another sample's setup is part of this sample's setup: its deadline holds,
    and a sample that gives up waiting leaves its group's setup running for the others."""
    task = SlowSetup({"prompt": "hi", "image": python_image(), "timeout": RolloutTimeouts(setup=1.0)})
    traces = group(task, 2)
    assert [t.errors[0].message for t in traces] == ["task setup timed out"] * 2


def test_snapshot_layers_keep_whiteouts_and_opaque_directories(tmp_path: Path) -> None:
    """The frozen copy of a writable layer is still an overlay layer: a 0/0 character device
    for a removed file, ``trusted.overlay.opaque`` on a replaced directory."""
    from rollout_ray._runtimes.snapshot import copy_layer

    upper = tmp_path / "upper"
    (upper / "dir").mkdir(parents=True)
    os.mknod(upper / "gone", 0o600 | 0o020000, os.makedev(0, 0))
    os.setxattr(upper / "dir", "trusted.overlay.opaque", b"y")
    (upper / "link").symlink_to("/etc/passwd")
    copy_layer(str(upper), str(tmp_path / "copy"))
    copy = tmp_path / "copy"
    st = os.lstat(copy / "gone")
    assert os.major(st.st_rdev) == 0 and os.minor(st.st_rdev) == 0 and (st.st_mode & 0o170000) == 0o020000
    assert os.getxattr(copy / "dir", "trusted.overlay.opaque") == b"y"
    assert os.readlink(copy / "link") == "/etc/passwd"
