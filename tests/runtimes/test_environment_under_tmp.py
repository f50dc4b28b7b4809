"""A sandbox over the host's system shows its work directory and the running virtual environment
at their host paths. When those are under ``/tmp`` (a runtime's root by default; a CI checkout),
their mount points lie in the runtime's own ``/tmp``, where programs write: a link planted
there must not steer what bwrap makes onto the host (``skeleton.py``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_ray import SandboxRuntime
from rollout_ray._runtimes import layout
from rollout_ray._runtimes.sandbox import sandbox_unavailable

pytestmark = [
    pytest.mark.security,
    pytest.mark.skipif(sandbox_unavailable() is not None, reason=f"no sandbox: {sandbox_unavailable()}"),
]

UP = "../" * 40  # more than enough to climb from bwrap's new root to its old one


@pytest.fixture
def venv_under_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The layout as if this process ran from a virtual environment under ``/tmp``."""
    assert str(tmp_path).startswith("/tmp/")
    venv = tmp_path / "checkout" / ".venv"
    site = venv / "lib" / "python3" / "site-packages"
    site.mkdir(parents=True)
    (site / "marker.py").write_text("HERE = 1\n")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    monkeypatch.setattr(layout, "_venv", lambda: str(venv))
    monkeypatch.setattr(layout, "_site_packages", lambda _venv: [str(site)])
    layout._environment.cache_clear()
    yield venv
    layout._environment.cache_clear()


def test_links_planted_on_the_way_to_the_environment_steer_nothing_onto_the_host(
    venv_under_tmp: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "rt").mkdir()
    venv = str(venv_under_tmp)
    plant = (
        f"rm -rf {venv}/bin {venv}/lib 2>/dev/null; mkdir -p {venv}; "
        f"ln -s {UP}oldroot{victim} {venv}/bin; ln -s {UP}oldroot{victim} {venv}/lib; "
        f"ln -s {UP}oldroot{victim} {venv}/pyvenv.cfg; echo planted"
    )

    async def main() -> list[str]:
        rt = SandboxRuntime(root=str(tmp_path / "rt"))
        await rt.start()
        try:
            r = await rt.exec(["sh", "-c", plant])
            assert r.stdout.endswith("planted\n"), r.stderr
            seen = []
            for _ in range(2):  # execs after the planting: bwrap sets the environment up again
                r = await rt.exec(["sh", "-c", f"ls {venv}/lib/python3/site-packages; cat {venv}/pyvenv.cfg"])
                seen.append(r.stdout)
            return seen
        finally:
            await rt.stop()

    seen = asyncio.run(main())
    assert os.listdir(victim) == []  # no link, file or directory made on the host
    assert seen == ["marker.py\nhome = /usr/bin\n"] * 2  # and the environment is still there


def test_a_link_planted_over_the_work_directorys_parent_steers_nothing_onto_the_host(tmp_path: Path) -> None:
    """The default root is under ``/tmp``: the work directory's mount point is in the runtime's
    ``/tmp``. A program moves its top directory away and plants a link to the host there."""
    victim = tmp_path / "victim"
    victim.mkdir()

    async def main() -> str:
        rt = SandboxRuntime(root=str(tmp_path))
        await rt.start()
        try:
            assert rt.workdir is not None and rt.workdir.startswith("/tmp/")
            top = "/tmp/" + rt.workdir.split("/")[2]
            r = await rt.exec(
                [
                    "sh",
                    "-c",
                    f"mv {top} /tmp/moved 2>/dev/null || echo kept; "
                    f"ln -s {UP}oldroot{victim} {top} 2>/dev/null || echo refused",
                ]
            )
            assert r.exit_code == 0, r.stderr
            return (await rt.exec(["sh", "-c", "pwd; echo ok > here; cat here"])).stdout
        finally:
            await rt.stop()

    out = asyncio.run(main())
    assert os.listdir(victim) == []
    assert out.endswith("ok\n")  # the work directory is still the runtime's own
