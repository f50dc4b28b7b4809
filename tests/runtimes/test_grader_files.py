"""Issue 23 §4: the grader's files — out of the agent's reach while it runs (it lists, reads,
writes, plants a link at their place: nothing), put in only once its processes are gone, and
read by a fresh exec for scoring, as the task declared them."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from image_rig import BOXES, needs_image, python_image, shared_cache

from rollout_ray import LocalRuntime, RolloutSpec, SandboxRuntime, Task, Trace, reward
from rollout_ray._core.harness import HarnessContext
from rollout_ray._errors import SandboxError
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._runtimes import image_cache
from rollout_ray.testing import MemoryRuntime, ScriptedHarness, ScriptedModel

pytestmark = pytest.mark.security

FILES = {
    "tests/test_fix.py": "def test_fix():\n    assert open('/work/answer').read() == '42\\n'\n",
    "expected": "42\n",
}

PROBE = (
    "ls -A /.grader; cat /.grader/expected 2>/dev/null && echo READ; "
    "{ echo forged > /.grader/expected; } 2>/dev/null && echo WROTE; "
    "ln -s /work/fake /.grader/tests 2>/dev/null && echo LINKED; "
    "mkdir /.grader/tests 2>/dev/null && echo MADE; "
    "rm -rf /.grader 2>/dev/null; mv /.grader /moved 2>/dev/null && echo MOVED; "
    "rmdir /.grader 2>/dev/null && ln -s /work /.grader && echo REPLACED; "
    "echo probed"
)


@asynccontextmanager
async def running(rt: LocalRuntime) -> AsyncIterator[LocalRuntime]:
    await rt.start()
    try:
        yield rt
    finally:
        await rt.stop()


@pytest.mark.parametrize("box", BOXES)
def test_the_agent_finds_nothing_at_the_graders_path_and_can_put_nothing_there(
    box: Callable[..., SandboxRuntime], tmp_path: Path
) -> None:
    async def main() -> None:
        async with running(box(root=str(tmp_path))) as rt:
            r = await rt.exec(["sh", "-c", PROBE])
            assert (r.exit_code, r.stdout) == (0, "probed\n"), r.stderr
            assert await rt.add_grader_files(FILES) == "/.grader"
            r = await rt.exec(["sh", "-c", "cat /.grader/expected; cat /.grader/tests/test_fix.py; ls -A /.grader"])
            assert r.stdout == FILES["expected"] + FILES["tests/test_fix.py"] + "expected\ntests\n"
            r = await rt.exec(
                [
                    "sh",
                    "-c",
                    "echo forged > /.grader/expected || rm -rf /.grader/tests; cat /.grader/expected; ls /.grader",
                ]
            )
            assert r.stdout == "42\nexpected\ntests\n"  # read-only for the grader's execs too

    asyncio.run(main())


@pytest.mark.parametrize("box", BOXES)
def test_an_agent_process_still_running_is_killed_before_the_files_arrive(
    box: Callable[..., SandboxRuntime], tmp_path: Path
) -> None:
    """A program of the agent that waits for the files (to copy them out, or to replace them)
    is gone before they are written: its exec ends killed, and it copied nothing."""
    watcher = "while true; do cat /.grader/expected >> /tmp/stolen 2>/dev/null; echo > /tmp/started; sleep 0.01; done"

    async def main() -> None:
        async with running(box(root=str(tmp_path))) as rt:
            watching = asyncio.ensure_future(rt.exec(["sh", "-c", watcher]))
            while not (await rt.exec(["sh", "-c", "test -e /tmp/started && echo yes"])).stdout:
                pass  # bounded by the test timeout: the watcher starts within milliseconds
            await rt.add_grader_files(FILES)
            result = await asyncio.wait_for(watching, 10)
            assert result.exit_code != 0
            assert (await rt.exec(["sh", "-c", "cat /tmp/stolen; echo end"])).stdout == "end\n"

    asyncio.run(main())


PLANT = """
printf 'import shutil\\nshutil.copytree("/.grader", "/tmp/stolen")\\nprint("1 passed")\\n' > pytest.py
site=$(python3 -m site --user-site) && mkdir -p "$site" && cp pytest.py "$site/" &&
echo "import os; os.makedirs('/tmp/pth-ran', exist_ok=True)" > "$site/agent.pth"
echo "import pytest" > sitecustomize.py; cp sitecustomize.py usercustomize.py; echo planted
"""


@pytest.mark.parametrize("box", BOXES)
def test_a_grader_imports_nothing_the_agent_left(box: Callable[..., SandboxRuntime], tmp_path: Path) -> None:
    """Issue 32 §3: an agent's ``./pytest.py`` (or one in its user site-packages, or a ``.pth``
    there) is not what ``python3 -m pytest`` runs once the grader's turn came: the grader's
    execs start in ``/.grader`` with ``HOME`` there, no user site and no current directory on
    the module path."""

    async def main() -> None:
        async with running(box(root=str(tmp_path))) as rt:
            workdir = rt.workdir or "/nowhere"
            planted = await rt.exec(["sh", "-c", PLANT])
            assert planted.stdout.endswith("planted\n"), planted.stderr
            assert await rt.add_grader_files(FILES) == "/.grader"
            graded = await rt.exec(["python3", "-m", "pytest", "--version"])
            assert "1 passed" not in graded.stdout, graded.stdout
            script = "pwd; echo $HOME; ls -A /tmp; python3 -c 'import sys; print(sys.path)'"
            lines = (await rt.exec(["sh", "-c", script])).stdout.splitlines()
            assert lines[:2] == ["/.grader", "/.grader"], lines
            assert "stolen" not in lines and "pth-ran" not in lines, lines
            path = ast.literal_eval(lines[-1])
            assert "" not in path and not any(".local" in p or p.startswith(workdir) for p in path), path

    asyncio.run(main())


def test_grader_file_names_stay_under_the_graders_directory(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(SandboxRuntime(root=str(tmp_path))) as rt:
            for name in ("/etc/passwd", "../escape", ""):
                with pytest.raises(ValueError, match="must be a relative path under the grader directory"):
                    await rt.add_grader_files({name: "x"})

    asyncio.run(main())


def test_a_local_runtime_puts_them_in_a_fresh_directory_whatever_the_agent_left(tmp_path: Path) -> None:
    """No isolation there, but nothing the agent left at ``.grader`` (a link to its own forged
    tests, a directory of them) is followed or kept."""
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / "expected").write_text("forged\n")

    async def main() -> None:
        async with running(LocalRuntime(root=str(tmp_path))) as rt:
            await rt.exec(["sh", "-c", f"ln -s {forged} .grader"])
            directory = await rt.add_grader_files(FILES)
            assert directory == str(Path(rt.workdir or "") / ".grader")
            assert (await rt.read(".grader/expected")) == b"42\n"

    asyncio.run(main())
    assert sorted(p.name for p in forged.iterdir()) == ["expected"] and (forged / "expected").read_text() == "forged\n"


def test_a_runtime_that_cannot_keep_them_apart_fails_the_rollout() -> None:
    async def main() -> None:
        async with running(MemoryRuntime()) as rt:  # type: ignore[arg-type]
            with pytest.raises(SandboxError, match="cannot hold a task's grader files"):
                await rt.add_grader_files(FILES)

    asyncio.run(main())


# -- through a rollout ---------------------------------------------------------------------------


class Graded(Task):
    """Scored by its hidden files against what the agent wrote."""

    def grader_files(self) -> Mapping[str, bytes | str]:
        return FILES

    @reward
    async def passed(self, runtime: Any) -> float:
        check = f"cmp -s {runtime.grader_dir}/expected /work/answer && echo pass"
        return float((await runtime.exec(["sh", "-c", check])).stdout == "pass\n")

    @reward
    async def hidden_from_agent(self, runtime: Any) -> float:
        return float((await runtime.read("/work/agent_saw")) == b"probed\n")


def agent(answer: str) -> ScriptedHarness:
    async def act(ctx: HarnessContext) -> None:
        result = await ctx.runtime.exec(
            ["sh", "-c", f"mkdir -p /work; ({PROBE}) > /work/agent_saw 2>&1; echo {answer} > /work/answer"]
        )
        assert result.exit_code == 0, result.stderr

    return ScriptedHarness(before_segment=act)


@pytest.fixture
def node_cache(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("ROLLOUT_RAY_IMAGE_CACHE", shared_cache().root)
    image_cache.default_image_cache.cache_clear()
    yield
    image_cache.default_image_cache.cache_clear()


@needs_image
@pytest.mark.parametrize(("answer", "passed"), [("42", 1.0), ("41", 0.0)])
def test_a_rollout_scores_with_files_its_agent_never_saw(answer: str, passed: float, node_cache: Any) -> None:
    async def main() -> Trace:
        async with LocalExecutor(runtime="sandbox") as executor:
            task = Graded({"prompt": "fix it", "image": python_image()})
            return await executor.run(RolloutSpec(task, agent(answer), ScriptedModel(default="done")))

    trace = asyncio.run(main())
    assert trace.errors == []
    assert {k: r.score for k, r in trace.rewards.items()} == {"passed": passed, "hidden_from_agent": 1.0}
