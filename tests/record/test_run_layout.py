"""A run directory's layout has one owner, ``_record/run_layout.py``: what the driver writes is
what it describes, and no other module spells a name of it."""

from __future__ import annotations

import ast
import asyncio
import pathlib

from rollout_ray import ChatHarness
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._record.run_layout import GROUPS, LOCK, MANIFEST, REPORT_PLOT, SAMPLES, STATUS, RunLayout, shard_index
from rollout_ray.testing import ScriptedModel

from conftest import tasks

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "rollout_ray"

FILE_NAMES = {MANIFEST, LOCK, REPORT_PLOT}
"""Names that mean a run directory's file wherever they appear."""
FOLDER_NAMES = {SAMPLES, GROUPS}
"""Names that mean a run directory's folder when a path is built with them (elsewhere they
are words: a summary's ``groups`` count)."""


def spelled_names(source: str) -> list[str]:
    """The run directory's names ``source`` spells itself (not through ``run_layout``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in FILE_NAMES or node.value.startswith("part-"):
                found.append(node.value)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found += [
                n.value for n in (node.left, node.right) if isinstance(n, ast.Constant) and n.value in FOLDER_NAMES
            ]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "join":
            found += [a.value for a in node.args if isinstance(a, ast.Constant) and a.value in FOLDER_NAMES]
    return found


OTHER_FORMATS = ("_runtimes/", "_harnesses/agent_install.py")
"""Files whose names of the same spelling belong to other formats: an image's
``manifest.json`` (``docker save``), the image cache's ``.lock``, an agent install's lock."""


def test_no_module_but_run_layout_spells_a_name_of_a_run_directory() -> None:
    spelled = {
        str(path.relative_to(PACKAGE)): names
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "run_layout.py"
        and not str(path.relative_to(PACKAGE)).startswith(OTHER_FORMATS)
        and (names := spelled_names(path.read_text()))
    }
    assert spelled == {}


def test_the_check_finds_a_name_spelled_in_a_path() -> None:
    source = 'import os\nm = os.path.join(d, "manifest.json")\ns = root / "shards"\nn = {"groups": 3}\n'
    assert sorted(spelled_names(source)) == ["manifest.json", "shards"]


def test_a_run_the_driver_writes_is_the_layout_it_describes(tmp_path: pathlib.Path) -> None:
    async def main() -> None:
        async with LocalExecutor() as ex:
            await Driver(
                tasks(3),
                ChatHarness(retries=0),
                ScriptedModel(default="4"),
                executor=ex,
                config=EvalConfig(rows_per_shard=2),
                run_dir=str(tmp_path),
            ).arun()

    asyncio.run(main())
    layout = RunLayout(tmp_path)
    assert layout.holds_run() and not RunLayout(tmp_path / "nothing").holds_run()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [MANIFEST, LOCK, SAMPLES, GROUPS, STATUS]
    )  # status.json stays with the final state
    assert [shard_index(p) for p in layout.shards()] == [0, 1] and layout.shards()[0] == layout.shard(0)
    assert [p.parent for p in layout.shards(GROUPS)] == [layout.folder(GROUPS)] * len(layout.shards(GROUPS))
