"""The README's command-line section stays true: its table names every eval flag, and its
pandas / polars / duckdb lines run over a real run directory."""

from __future__ import annotations

import pathlib
import re

import pytest

from rollout_ray._cli import main as cli

ROOT = pathlib.Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()


def test_the_flag_table_names_every_eval_flag() -> None:
    eval_parser = cli.parser()._subparsers._group_actions[0].choices["eval"]  # type: ignore[union-attr]
    flags = {s for a in eval_parser._actions for s in a.option_strings if s.startswith("--")} - {"--help"}
    table = README[README.index("| `rollout-ray eval TASKSET` flag"):]
    table = table[: table.index("\n\n")]
    assert sorted(f for f in flags if f"`{f}" not in table) == []


def test_the_dataframe_lines_run_over_a_run_directory(tmp_path: pathlib.Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("pandas", "polars", "duckdb"):
        pytest.importorskip(name)
    out = str(tmp_path / "calc")
    code = cli.main(["eval", str(ROOT / "examples" / "arith.py"), "--executor", "local", "--sim-ttft", "0",
                     "--limit", "3", "--samples", "4", "--temperature", "1", "--out", out])
    assert code == 0, capsys.readouterr().err
    block = re.search(r"```py\n(.*?)```", README, re.S).group(1)  # type: ignore[union-attr]
    lines = block.replace('"runs/calc"', repr(out)).splitlines()
    scope: dict[str, object] = {}
    exec("\n".join(lines[:3]), scope)
    pandas_, polars_, duckdb_ = (eval(line.split("  #")[0], scope) for line in lines[3:6])
    assert list(pandas_.columns) == ["reward", "advantage"] and len(pandas_) == 3
    assert polars_.columns == ["rollout_id", "advantage", "messages"] and len(polars_) > 0
    assert (polars_["advantage"] > 0).all()
    assert len(duckdb_) == 3 and all(len(row) == 3 for row in duckdb_)
