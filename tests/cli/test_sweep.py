"""``rollout-ray sweep``: grid expansion, grid-file validation, a whole sweep, resume."""

from __future__ import annotations

import math
import os
import pathlib
import shutil
from collections.abc import Iterator
from typing import Any

import pyarrow.csv
import pyarrow.parquet as pq
import pytest

from rollout_ray._cli import main as cli
from rollout_ray._cli.drive import make_executor
from rollout_ray._cli.grid import SweepGrid, expand, load_sweep
from rollout_ray._cli.summary import summarize
from rollout_ray._core.limits import LIMIT_FIELDS
from rollout_ray._driver.run_dir import stored_results
from rollout_ray._errors import UsageError
from rollout_ray._record.store import read_manifest, read_run

ARITH = str(pathlib.Path(__file__).parents[2] / "examples" / "arith.py")
NAMES = [
    "001-model=good-temperature=0.0",
    "002-model=good-temperature=0.7",
    "003-model=bad-temperature=0.0",
    "004-model=bad-temperature=0.7",
]
GRID = f"""
taskset = "{ARITH}"
[base]
samples = 2
limit = 2
pass_k = [1, 2]
executor = "ray"    # the tests pass --executor local
[grid]
model = [{{name = "good", ttft = 0}}, {{name = "bad", ttft = 0, error_rate = 1.0}}]
sampling = [{{temperature = 0.0}}, {{temperature = 0.7}}]
"""


def _write(tmp_path: pathlib.Path, text: str, name: str = "grid.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- the grid ---------------------------------------------------------------------------------


def test_points_are_the_product_of_the_axes_named_in_product_order() -> None:
    grid = SweepGrid.model_validate(
        {
            "model": [{"name": "sim"}, {"name": "gpt-4o", "url": "http://127.0.0.1:1/v1"}],
            "sampling": [{"temperature": 0.7, "top_p": 0.9}, {"temperature": 1}],
            "limits": [{"max_turns": 4}],
            "harness": ["harness", "rollout_ray:ChatHarness"],
        }
    )
    points = expand(grid)
    assert len(points) == 2 * 2 * 1 * 2
    assert [p.name for p in points] == [
        "001-model=sim-temperature=0.7-top_p=0.9-max_turns=4-harness=harness",
        "002-model=sim-temperature=0.7-top_p=0.9-max_turns=4-harness=rollout_ray_ChatHarness",
        "003-model=sim-temperature=1-max_turns=4-harness=harness",
        "004-model=sim-temperature=1-max_turns=4-harness=rollout_ray_ChatHarness",
        "005-model=gpt-4o-temperature=0.7-top_p=0.9-max_turns=4-harness=harness",
        "006-model=gpt-4o-temperature=0.7-top_p=0.9-max_turns=4-harness=rollout_ray_ChatHarness",
        "007-model=gpt-4o-temperature=1-max_turns=4-harness=harness",
        "008-model=gpt-4o-temperature=1-max_turns=4-harness=rollout_ray_ChatHarness",
    ]
    assert points[6].settings() == {"model": "gpt-4o", "temperature": 1, "max_turns": 4, "harness": "harness"}
    assert [p.name for p in expand(grid)] == [p.name for p in points]  # deterministic


def test_an_empty_grid_is_one_point_on_the_simulated_model() -> None:
    (point,) = expand(SweepGrid())
    assert point.name == "001-model=simulated"
    assert (point.model.url, point.sampling, point.limits, point.harness) == (None, {}, {}, "harness")


def test_point_numbers_widen_past_999() -> None:
    grid = SweepGrid.model_validate({"sampling": [{"seed": i} for i in range(1000)]})
    names = [p.name for p in expand(grid)]
    assert names[0] == "0001-model=simulated-seed=0" and names[-1] == "1000-model=simulated-seed=999"


def test_two_simulated_models_differ_only_in_their_settings() -> None:
    good, bad = SweepGrid.model_validate(
        {"model": [{"name": "good"}, {"name": "bad", "error_rate": 0.25, "seed": 3}]}
    ).model
    assert good.simulated().error_rate == 0.0
    assert (bad.simulated().error_rate, bad.simulated().seed, bad.simulated().model_name) == (0.25, 3, "simulated")


# -- validation -------------------------------------------------------------------------------

HEAD = f'taskset = "{ARITH}"\n'


@pytest.mark.parametrize(
    ("body", "problems"),
    [
        (HEAD + "[base]\nsample = 2\n", ["base.sample: unknown key"]),
        (HEAD + "[base]\nsamples = 0\n", ["base.samples: Input should be greater than or equal to 1"]),
        (HEAD + '[base]\nexecutor = "slurm"\n', ["base.executor: Input should be 'ray' or 'local'"]),
        (HEAD + "[base]\npass_k = [2, 0]\n", ["base.pass_k[1]: Input should be greater than or equal to 1"]),
        (HEAD + '[grid]\nmodel = "sim"\n', ["grid.model: Input should be a valid list"]),
        (HEAD + "[grid]\ntemperature = [0.7]\n", ["grid.temperature: unknown key"]),
        (
            HEAD + '[grid]\nmodel = [{name = "a"}, {name = "b", eror_rate = 0.1}]\n',
            ["grid.model[1].eror_rate: unknown key"],
        ),
        (
            HEAD + '[grid]\nmodel = [{name = "a"}, {name = "a"}]\n',
            ["grid.model: model names must be unique; repeated: a"],
        ),
        (
            HEAD + '[grid]\nmodel = [{name = "x", url = "http://h/v1", error_rate = 0.1, ttft = 0}]\n',
            [
                "grid.model[0]: simulated-model settings (error_rate, ttft) given with url; remove them, or "
                "remove url to use the simulated model"
            ],
        ),
        (
            HEAD + "[grid]\nlimits = [{max_turn = 3}]\n",
            [
                "grid.limits[0].max_turn: unknown key; expected 'max_turns', 'max_input_tokens', "
                "'max_output_tokens' or 'max_total_tokens'"
            ],
        ),
        (
            HEAD + "[grid]\nlimits = [{max_turns = -1}, {max_turns = true}]\n",
            [
                "grid.limits[0].max_turns: Input should be greater than or equal to 0",
                "grid.limits[1].max_turns: Input should be a valid integer",
            ],
        ),
        (
            HEAD + "[grid]\nsampling = [{temperature = [1]}]\n",
            ["grid.sampling[0].temperature: must be a number, a string or a boolean, got list"],
        ),
        (HEAD + "[grid]\nharness = []\n", ["grid.harness: List should have at least 1 item after validation, not 0"]),
        ("[grid]\n", ["taskset: Field required"]),
        ('taskset = "no/such/taskset.py"\n', ["taskset: no such file: no/such/taskset.py"]),
        (HEAD + "[grid\n", ["invalid TOML: Expected ']' at the end of a table declaration (at line 2, column 6)"]),
    ],
)
def test_a_bad_grid_file_names_the_key_and_the_file(tmp_path: pathlib.Path, body: str, problems: list[str]) -> None:
    path = _write(tmp_path, body)
    with pytest.raises(UsageError) as info:
        load_sweep(path)
    assert str(info.value).splitlines() == [f"{path}: {p}" for p in problems]


def test_unknown_sampling_keys_list_every_known_one(tmp_path: pathlib.Path) -> None:
    path = _write(tmp_path, HEAD + "[grid]\nsampling = [{temprature = 0.7}]\n")
    with pytest.raises(
        UsageError,
        match=r"^.*: grid\.sampling\[0\]\.temprature: unknown key; expected "
        r"'frequency_penalty', .* or 'top_p'$",
    ):
        load_sweep(path)


def test_a_harness_that_is_not_a_function_of_the_taskset_is_named(tmp_path: pathlib.Path) -> None:
    path = _write(tmp_path, HEAD + '[grid]\nharness = ["harness", "nothere", "no_such_module_x:f", "math:pi"]\n')
    with pytest.raises(UsageError) as info:
        load_sweep(path)
    assert info.value.problems == [
        (
            "grid.harness[1]",
            f"'nothere' is not a function of {ARITH}; name a function returning a Harness, or 'module:function'",
        ),
        ("grid.harness[2]", "cannot import no_such_module_x: No module named 'no_such_module_x'"),
        (
            "grid.harness[3]",
            "'pi' is not a function of math; name a function returning a Harness, or 'module:function'",
        ),
    ]


def test_harnesses_are_taskset_functions_or_module_paths(tmp_path: pathlib.Path) -> None:
    from rollout_ray import ChatHarness

    sweep = load_sweep(_write(tmp_path, HEAD + '[grid]\nharness = ["harness", "rollout_ray:ChatHarness"]\n'))
    assert list(sweep.harnesses) == ["harness", "rollout_ray:ChatHarness"]
    assert all(isinstance(h, ChatHarness) for h in sweep.harnesses.values())
    assert [p.harness for p in sweep.points] == ["harness", "rollout_ray:ChatHarness"]
    assert len(sweep.tasks) == 50  # no [base] limit


def test_the_command_exits_2_on_a_bad_grid_and_runs_nothing(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, HEAD + "[base]\nsample = 2\n[grid]\nlimits = [{max_turn = 3}]\n")
    out = tmp_path / "out"
    assert cli.main(["sweep", path, "--out", str(out), "--executor", "local"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"rollout-ray sweep: {path}: base.sample: unknown key",
        f"rollout-ray sweep: {path}: grid.limits[0].max_turn: unknown key; expected 'max_turns', "
        "'max_input_tokens', 'max_output_tokens' or 'max_total_tokens'",
    ]
    assert not out.exists()


def test_limits_accept_exactly_the_rollout_limit_fields() -> None:
    grid = SweepGrid.model_validate({"limits": [dict.fromkeys(LIMIT_FIELDS, 1)]})
    assert list(grid.limits[0]) == list(LIMIT_FIELDS)


# -- a whole sweep ----------------------------------------------------------------------------


@pytest.fixture
def executors(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kinds of every executor the sweep makes."""
    made: list[str] = []

    def counting(kind: str, *args: Any, **kwargs: Any) -> Any:
        made.append(kind)
        return make_executor(kind, *args, **kwargs)

    monkeypatch.setattr("rollout_ray._cli.sweep.make_executor", counting)
    return made


@pytest.fixture
def swept(
    tmp_path: pathlib.Path, executors: list[str], capsys: pytest.CaptureFixture[str]
) -> Iterator[tuple[str, str, str]]:
    """A finished sweep of GRID with the local executor: (out dir, stdout, stderr)."""
    out = str(tmp_path / "sweep")
    assert cli.main(["sweep", _write(tmp_path, GRID), "--out", out, "--executor", "local"]) == 0
    captured = capsys.readouterr()
    yield out, captured.out, captured.err


def test_a_sweep_writes_one_run_per_point_and_a_comparison(swept: tuple[str, str, str], executors: list[str]) -> None:
    out, stdout, stderr = swept
    assert executors == ["local"]  # one executor for the whole sweep
    assert sorted(os.listdir(out)) == [*NAMES, "comparison.csv", "comparison.parquet", "comparison.png", "grid.toml"]
    for i, name in enumerate(NAMES, 1):
        assert f"[{i}/4] {name}: 2 tasks × 2 samples, model: built-in simulated model at " in stderr
        assert read_run(os.path.join(out, name)).num_rows == 4
    table = pq.read_table(os.path.join(out, "comparison.parquet"))
    assert table.column_names[:8] == ["point", "model", "temperature", "harness", "status", "rollouts", "ok", "failed"]
    assert {
        "mean_reward",
        "reward_sem",
        "pass_at_1",
        "pass_at_2",
        "total_tokens",
        "agent_p50_s",
        "agent_p95_s",
        "stop_agent_completed",
        "reason",
        "run_dir",
    } <= set(table.column_names)
    assert table["point"].to_pylist() == NAMES
    assert table["model"].to_pylist() == ["good", "good", "bad", "bad"]
    assert table["temperature"].to_pylist() == [0.0, 0.7, 0.0, 0.7]
    assert table["mean_reward"].to_pylist() == [1.0, 0.75, 0.0, 0.0]  # "bad": always wrong; at 0.7 "good" errs too
    csv = pyarrow.csv.read_csv(os.path.join(out, "comparison.csv"))
    assert csv.column_names == table.column_names
    for from_csv, row in zip(csv.to_pylist(), table.to_pylist(), strict=True):
        assert from_csv == {k: pytest.approx(v) if isinstance(v, float) else v for k, v in row.items()}
    with open(os.path.join(out, "comparison.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    lines = stdout.splitlines()
    assert lines[0].split()[:5] == ["#", "model", "temperature", "harness", "status"]
    assert lines[3].split()[:8] == ["003", "bad", "0.0", "harness", "completed", "4", "0", "0.0000"]


def test_the_comparison_matches_each_runs_own_summary(swept: tuple[str, str, str]) -> None:
    out = swept[0]
    for row in pq.read_table(os.path.join(out, "comparison.parquet")).to_pylist():
        recorded = read_manifest(row["run_dir"]).config
        assert recorded["sweep"]["sampling"] == {"temperature": row["temperature"]}
        samples, groups = stored_results(row["run_dir"])  # finalized as each group closed
        s = summarize(samples, groups)
        assert (row["rollouts"], row["ok"], row["failed"], row["groups"]) == (
            s["rollouts"],
            s["ok"],
            s["failed"],
            s["groups"],
        )
        assert row["mean_reward"] == s["mean_reward"]
        assert {k: row[f"pass_at_{k}"] for k in (1, 2)} == s["pass_at"]
        assert row["stop_agent_completed"] == s["stop_conditions"]["agent_completed"] == 4
        for name, (total, mean) in s["tokens"].items():
            assert (row[name], row[f"{name}_per_rollout"]) == (total, mean)
        for span, (p50, p95) in s["spans"].items():
            assert (row[f"{span}_p50_s"], row[f"{span}_p95_s"]) == (p50, p95)
        rewards = samples["reward"].to_pylist()
        assert row["reward_sem"] == pytest.approx(math.sqrt(sum((r - s["mean_reward"]) ** 2 for r in rewards) / 3 / 4))


def test_a_finished_sweep_is_not_overwritten_without_resume(
    swept: tuple[str, str, str], tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = swept[0]
    assert cli.main(["sweep", str(tmp_path / "grid.toml"), "--out", out, "--executor", "local"]) == 2
    assert capsys.readouterr().err == (
        f"rollout-ray sweep: {out}: already holds runs of a sweep ({NAMES[0]}, "
        "...); pass --resume to continue it, or choose another --out\n"
    )


def test_resume_skips_complete_points_and_resumes_the_others(
    swept: tuple[str, str, str], tmp_path: pathlib.Path, executors: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = swept[0]
    before = {n: sorted(os.listdir(os.path.join(out, n, "shards"))) for n in NAMES}
    shutil.rmtree(os.path.join(out, NAMES[1], "shards"))  # point 2 was cut short before its first shard
    args = ["sweep", str(tmp_path / "grid.toml"), "--out", out, "--executor", "local", "--resume"]
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    for i in (1, 3, 4):
        assert f"[{i}/4] {NAMES[i - 1]}: skipped (complete), mean reward " in err
        assert sorted(os.listdir(os.path.join(out, NAMES[i - 1], "shards"))) == before[NAMES[i - 1]]
    assert f"[2/4] {NAMES[1]}: 2 tasks × 2 samples" in err and f"[2/4] {NAMES[1]}: completed" in err
    assert read_run(os.path.join(out, NAMES[1])).num_rows == 4
    table = pq.read_table(os.path.join(out, "comparison.parquet"))
    assert table["rollouts"].to_pylist() == [4, 4, 4, 4]
    assert table["status"].to_pylist() == ["stored", "completed", "stored", "stored"]
    assert table["mean_reward"].to_pylist() == [1.0, 0.75, 0.0, 0.0]
    assert executors == ["local", "local"]  # the first sweep's and this one's

    assert cli.main(args) == 0  # all complete now: no executor is even started
    assert executors == ["local", "local"]
    assert capsys.readouterr().err.count("skipped (complete)") == 4


def test_resume_refuses_a_point_stored_with_other_settings(
    swept: tuple[str, str, str], tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = swept[0]
    changed = _write(tmp_path, GRID.replace("samples = 2", "samples = 3"), "changed.toml")
    assert cli.main(["sweep", changed, "--out", out, "--executor", "local", "--resume"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"rollout-ray sweep: {out}: {name}: was run with other settings (eval.samples_per_task); resume "
        "with the grid it was run with, or choose another --out"
        for name in NAMES
    ]


@pytest.mark.ray
def test_a_sweep_on_ray_starts_one_executor_for_every_point(
    ray_cluster: Any, tmp_path: pathlib.Path, executors: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    grid = _write(
        tmp_path,
        GRID.replace('executor = "ray"', 'executor = "ray"\nactors = 1\ncapacity = 8').replace(
            "sampling = [{temperature = 0.0}, {temperature = 0.7}]", ""
        ),
    )
    out = str(tmp_path / "sweep")
    assert cli.main(["sweep", grid, "--out", out]) == 0
    assert executors == ["ray"]
    assert ray_cluster.is_initialized()  # a Ray the sweep did not start is left running
    table = pq.read_table(os.path.join(out, "comparison.parquet"))
    assert table["point"].to_pylist() == ["001-model=good", "002-model=bad"]
    assert table["mean_reward"].to_pylist() == [1.0, 0.0]
    capsys.readouterr()
