"""Issue 23 §1: a sandbox over a task's image — the image read-only under a private writable
layer, reached from a task (``TaskData.image``) through every executor, and no more of the
host than a host sandbox has, whatever a program plants in its root."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from image_rig import image_sandbox, needs_image, python_image, shared_cache

from rollout_ray import Reward, Rollout, RolloutSpec, SandboxRuntime, Task, Trace, reward
from rollout_ray._errors import SandboxError
from rollout_ray._harnesses.program import ProgramHarness
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._runtimes import image_cache
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray.testing import ScriptedModel

pytestmark = needs_image

AGENT_SOURCE = (Path(__file__).resolve().parents[2] / "examples" / "agent_program.py").read_text()
IMAGE_PYTHON = (
    "import os, sys; st = os.stat(os.path.realpath(sys.executable)); "
    "print(sys.prefix, sys.version.split()[0], st.st_dev, st.st_ino)"
)
"""What a sandbox's ``python3`` is: its prefix, version, and the file it runs (device, inode)."""


def on_the_images_python(line: str | bytes) -> bool:
    """Whether ``IMAGE_PYTHON``'s line came from a Python under /usr that is not the host's
    file: the host's Debian Python may be the very version the image has (a venv made with
    /usr/bin/python3), so only the file tells them apart (a bind mount keeps device and inode)."""
    prefix, _, dev, ino = (line.decode() if isinstance(line, bytes) else line).split()
    host = shutil.which("python3", path="/usr/bin:/bin")
    if host is None:
        return prefix == "/usr"
    st = os.stat(os.path.realpath(host))
    return prefix == "/usr" and (int(dev), int(ino)) != (st.st_dev, st.st_ino)


def run(main: Any) -> Any:
    return asyncio.run(main())


@asynccontextmanager
async def running(rt: SandboxRuntime) -> AsyncIterator[SandboxRuntime]:
    await rt.start()
    try:
        yield rt
    finally:
        await rt.stop()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_writes_land_in_the_runtimes_own_layer(tmp_path: Path) -> None:
    """Anywhere in the image is writable; the write persists across the runtime's execs, is
    seen by its concurrent execs, by no other runtime, and never reaches the cached image."""
    python = Path(shared_cache().lease(python_image()).rootfs) / "usr" / "bin"
    before = digest(python / "python3")

    async def main() -> None:
        async with running(image_sandbox(root=str(tmp_path))) as one, running(image_sandbox(root=str(tmp_path))) as two:
            r = await one.exec(["sh", "-c", "echo mine > /usr/bin/python3; echo new > /etc/added; rm /bin/ls"])
            assert r.exit_code == 0, r.stderr
            both = await asyncio.gather(
                one.exec(["sh", "-c", "echo a > /a; cat /etc/added"]),
                one.exec(["sh", "-c", "echo b > /b; cat /usr/bin/python3"]),
            )
            assert [r.stdout for r in both] == ["new\n", "mine\n"]
            r = await one.exec(["sh", "-c", "cat /a /b; test -e /bin/ls || echo ls gone"])
            assert r.stdout == "a\nb\nls gone\n"
            r = await two.exec(["sh", "-c", "test -e /etc/added || echo clean; /bin/ls /bin/ls"])
            assert r.stdout == "clean\n/bin/ls\n"
            assert await one.read("/etc/added") == b"new\n"
            await one.write("/opt/from-host", "written by the runtime")
            assert (await one.exec(["cat", "/opt/from-host"])).stdout == "written by the runtime"

    run(main)
    assert digest(python / "python3") == before and (python.parent.parent / "bin" / "ls").is_symlink()
    assert os.listdir(tmp_path) == []


PLANT = (
    "rm -rf /tmp /run /work/.x; ln -s ../oldroot{host} /tmp; ln -s ../oldroot{host} /run; "
    "ln -s {host} /work/abs; ln -s ../../../../../../..{host} /work/up; "
    "for p in /proc /dev /.rollout-ray; do rmdir $p 2>/dev/null && echo removed $p; "
    "mv $p /moved 2>/dev/null && echo moved $p; done; echo planted"
)


def test_links_planted_in_the_root_steer_nothing_onto_the_host(tmp_path: Path) -> None:
    """bwrap makes no mount point where a program writes (``image_layout``): links planted
    at the mount points' places, or above them, leave the host untouched, and the runtime's
    own ``read`` / ``write`` refuse them."""
    host = tmp_path / "host"
    host.mkdir()

    async def main() -> None:
        async with running(image_sandbox(root=str(tmp_path / "rt"))) as rt:
            r = await rt.exec(["sh", "-c", PLANT.format(host=host)])
            assert (r.exit_code, r.stdout) == (0, "planted\n"), r.stderr  # the mount points stand
            await rt.prepare_execution(["http://127.0.0.1:65001/"])  # the forwarder's paths too
            r = await rt.exec(["sh", "-c", "echo hi > /tmp/x; ls /proc/self/ns >/dev/null && echo still"])
            assert r.stdout == "still\n" and "/tmp/x" in r.stderr
            for path in ("abs/x", "up/x", "/tmp/x", "/run/x"):
                with pytest.raises(SandboxError, match="is a symbolic link; links are not followed"):
                    await rt.write(path, "through a link?")
            r = await rt.exec(["sh", "-c", f"rm -rf /work; ln -s ../oldroot{host} /work"])
            assert r.exit_code == 0
            r = await rt.exec(["pwd"])  # the work dir is a link now: bwrap resolves it inside
            assert r.exit_code != 0

    (tmp_path / "rt").mkdir()
    run(main)
    assert os.listdir(host) == [] and os.listdir(tmp_path / "rt") == []


class Three(Task):
    @reward
    def correct(self, trace: Trace) -> float:
        return float(trace.last_reply == "3")


def agent() -> ProgramHarness:
    return ProgramHarness(["python3", "agent_program.py"], files={"agent_program.py": AGENT_SOURCE}, timeout=60)


def test_an_agent_program_runs_on_the_images_python(tmp_path: Path) -> None:
    """The example agent (stdlib only) on the image's Debian Python, reaching the proxy through
    the sandbox's relay (whose forwarder runs on the host's Python, shown read-only)."""
    task = Three({"prompt": "1+2?", "image": python_image()})

    async def main() -> tuple[Trace, str]:
        async with HTTPInterception() as proxy:
            trace = await Rollout(
                task,
                agent(),
                model=ScriptedModel(["3"]),
                interception=proxy,
                runtime_factory=lambda name, image=None: SandboxRuntime(
                    name, root=str(tmp_path), image=image, image_cache=shared_cache()
                ),
            ).run()
        async with running(image_sandbox(root=str(tmp_path))) as rt:
            version = (await rt.exec(["python3", "-c", IMAGE_PYTHON])).stdout
        return trace, version

    trace, version = run(main)
    assert trace.errors == [] and (trace.ok, trace.rewards) == (True, {"correct": Reward(1.0)})
    assert on_the_images_python(version)  # the image's Python, not the host's
    assert os.listdir(tmp_path) == []


class Checked(Task):
    """Records whether the program ran on the image's Python (it wrote IMAGE_PYTHON's line to /tmp/v)."""

    async def finalize(self, trace: Trace, runtime: Any) -> None:
        trace.metrics["on_image_python"] = float(on_the_images_python(await runtime.read("/tmp/v")))


VERSION_AGENT = """
import json, os, sys, urllib.request
body = json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode()
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body, headers={
    "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
urllib.request.urlopen(req, timeout=30).read()
"""


@pytest.fixture
def node_cache(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Executors use the node's default cache: here, the tests' one."""
    monkeypatch.setenv("ROLLOUT_RAY_IMAGE_CACHE", shared_cache().root)
    image_cache.default_image_cache.cache_clear()
    yield
    image_cache.default_image_cache.cache_clear()


@pytest.mark.parametrize("kind", ["sandbox", "local"])
def test_a_tasks_image_reaches_the_sandbox_through_the_local_executor(kind: str, node_cache: Any) -> None:
    harness = ProgramHarness(
        ["sh", "-c", f"python3 -c '{IMAGE_PYTHON}' > /tmp/v; python3 agent.py"],
        files={"agent.py": VERSION_AGENT},
        timeout=60,
    )

    async def main() -> Trace:
        async with LocalExecutor(runtime=kind) as executor:
            spec = RolloutSpec(Checked({"prompt": "v?", "image": python_image()}), harness, ScriptedModel(["ok"]))
            return await executor.run(spec)

    trace = run(main)
    if kind == "local":  # one plain line on the trace, no runtime started
        assert [e.type for e in trace.errors] == ["SandboxError"]
        assert trace.errors[0].message.endswith(
            f"image {python_image()!r} needs a SandboxRuntime, and this runtime "
            f"is local (use runtime='sandbox' on a machine that runs sandboxes)"
        )
        return
    assert trace.errors == [] and trace.metrics["on_image_python"] == 1.0


@pytest.mark.ray
def test_a_tasks_image_reaches_the_sandbox_of_a_ray_rollout_actor(ray_cluster: Any) -> None:
    from rollout_ray._ray.rollout_client import RolloutActor

    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    harness = ProgramHarness(
        ["sh", "-c", f"python3 -c '{IMAGE_PYTHON}' > /tmp/v; python3 agent.py"],
        files={"agent.py": VERSION_AGENT},
        timeout=60,
    )

    async def main() -> Trace:
        # The runtime actor (a child of the rollout actor) inherits its environment: the cache.
        actor = RolloutActor.create(
            capacity=1, runtime="sandbox", runtime_env={"env_vars": {"ROLLOUT_RAY_IMAGE_CACHE": shared_cache().root}}
        )
        try:
            return await actor.run(
                RolloutSpec(Checked({"prompt": "v?", "image": python_image()}), harness, ScriptedModel(["ok"]))
            )
        finally:
            await actor.aclose()

    trace = asyncio.run(main())
    assert trace.errors == [] and trace.metrics["on_image_python"] == 1.0
    assert trace.agent.runtime is not None and trace.agent.runtime.type == "sandbox"
