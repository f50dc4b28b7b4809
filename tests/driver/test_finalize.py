"""Group finalize over Arrow: stats, advantages, best, pass@k, failed samples, judge hook."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_ray._driver.finalize import FinalizeConfig, finalize

EPS = 1e-6


MAP = pa.map_(pa.string(), pa.float64())


def make_table(groups: list[str], rewards: list[float | None], ok: list[bool] | None = None) -> pa.Table:
    n = len(groups)
    return pa.table(
        {
            "group_id": pa.array(groups, pa.string()),
            "sample_idx": pa.array(list(range(n)), pa.int32()),
            "rollout_id": pa.array([f"r{i}" for i in range(n)], pa.string()),
            "ok": pa.array(ok if ok is not None else [True] * n, pa.bool_()),
            "reward": pa.array(rewards, pa.float64()),
            "rewards": pa.array([[("task", r or 0.0)] for r in rewards], MAP),
            "metrics": pa.array([[] for _ in range(n)], MAP),
        }
    )


# Two groups of four, interleaved, so row order must be kept.
# a = [1, 0, 1, 0]: mean 0.5, population std 0.5, sample std sqrt(1/3), c = 2
# b = [0, 0.5, 0.5, 1]: mean 0.5, population std sqrt(0.125), c = 1
TWO_GROUPS = make_table(
    ["a", "b", "a", "b", "a", "b", "a", "b"],
    [1.0, 0.0, 0.0, 0.5, 1.0, 0.5, 0.0, 1.0],
)


def col(table: pa.Table, name: str) -> list:
    return table[name].to_pylist()


def approx(values: list) -> list:
    return [v if v is None else pytest.approx(v, rel=1e-12, abs=1e-15) for v in values]


def test_group_stats_advantage_best_pass_with_std_normalisation() -> None:
    out = finalize(TWO_GROUPS, FinalizeConfig(pass_k=(1, 2, 4, 5)))
    s = out.samples
    assert col(s, "rollout_id") == [f"r{i}" for i in range(8)]  # input order kept
    assert col(s, "group_size") == [4] * 8
    assert col(s, "group_valid") == [4] * 8
    assert col(s, "group_mean") == [0.5] * 8
    sb = math.sqrt(0.125)
    assert col(s, "group_std") == approx([0.5, sb] * 4)
    assert col(s, "group_min") == [0.0] * 8
    assert col(s, "group_max") == [1.0] * 8
    da, db = 0.5 / (0.5 + EPS), 0.5 / (sb + EPS)
    assert col(s, "advantage") == approx([da, -db, -da, 0.0, da, 0.0, -da, db])
    assert col(s, "best") == [True, False, False, False, True, False, False, True]  # a: tie shares
    # a: n=4, c=2 -> pass@1 = 1/2, pass@2 = 1 - C(2,2)/C(4,2) = 5/6; b: c=1 -> 1/4, 1 - 3/6
    assert col(s, "pass_at_1") == approx([0.5, 0.25] * 4)
    assert col(s, "pass_at_2") == approx([5 / 6, 0.5] * 4)
    assert col(s, "pass_at_4") == [1.0] * 8
    assert col(s, "pass_at_5") == [None] * 8  # k > n
    assert s.schema.field("group_size").type == pa.int32()
    assert s.schema.field("group_valid").type == pa.int32()
    assert s.schema.field("best").type == pa.bool_()

    g = out.groups
    assert g.to_pydict() == {
        "group_id": ["a", "b"],
        "n": [4, 4],
        "n_valid": [4, 4],
        "n_failed": [0, 0],
        "mean": [0.5, 0.5],
        "std": approx([0.5, sb]),
        "min": [0.0, 0.0],
        "max": [1.0, 1.0],
        "n_correct": [2, 1],
        "pass_at_1": approx([0.5, 0.25]),
        "pass_at_2": approx([5 / 6, 0.5]),
        "pass_at_4": [1.0, 1.0],
        "pass_at_5": [None, None],
        "best_reward": [1.0, 1.0],
    }


def test_advantage_without_normalisation_and_sample_std() -> None:
    out = finalize(TWO_GROUPS, FinalizeConfig(normalize_std=False, std_ddof=1))
    assert col(out.samples, "advantage") == [0.5, -0.5, -0.5, 0.0, 0.5, 0.0, -0.5, 0.5]
    # ddof=1: a -> sqrt(1/3), b -> sqrt(0.5 / 3)
    assert col(out.groups, "std") == approx([math.sqrt(1 / 3), math.sqrt(0.5 / 3)])


def test_threshold_decides_correct() -> None:
    out = finalize(TWO_GROUPS, FinalizeConfig(correct_threshold=0.5))
    assert col(out.groups, "n_correct") == [2, 3]
    assert col(out.groups, "pass_at_1") == [0.5, 0.75]


def test_all_equal_group_marks_all_best_with_exact_zero_advantage() -> None:
    out = finalize(make_table(["g"] * 3, [0.1, 0.1, 0.1]))
    assert col(out.samples, "best") == [True, True, True]
    assert col(out.samples, "advantage") == [0.0, 0.0, 0.0]
    assert col(out.groups, "std") == [0.0]
    assert col(out.groups, "mean") == [0.1]  # not 0.1 + summation noise


@pytest.mark.parametrize("ddof, std", [(0, 0.0), (1, None)])
def test_group_of_one_sample(ddof: int, std: float | None) -> None:
    out = finalize(make_table(["solo", "x", "x"], [0.7, 0.0, 1.0]), FinalizeConfig(std_ddof=ddof))
    assert col(out.groups, "n") == [1, 2]
    assert col(out.groups, "std")[0] == std
    adv = col(out.samples, "advantage")
    assert adv[0] == 0.0 and math.isfinite(adv[0])
    assert col(out.samples, "best")[0] is True


def test_undefined_std_with_spread_gives_null_advantage() -> None:
    out = finalize(make_table(["g", "g"], [0.0, 1.0]), FinalizeConfig(std_ddof=2))
    assert col(out.groups, "std") == [None]
    assert col(out.samples, "advantage") == [None, None]
    assert col(out.samples, "best") == [False, True]


# Failure policies. a = [1, 0, 1, 0] all ok; b = [0, 0.5, 1, <failed, reward 0.8>].
WITH_FAILED = make_table(
    ["a", "a", "a", "a", "b", "b", "b", "b"],
    [1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 1.0, 0.8],
    ok=[True] * 7 + [False],
)


def test_a_failed_sample_counts_as_reward_zero_and_not_correct() -> None:
    """One rule (issue 19): a failed sample is in n at reward 0, never in c."""
    out = finalize(WITH_FAILED, FinalizeConfig(normalize_std=False, pass_k=(1, 4)))
    s = out.samples
    # b counted as [0, 0.5, 1, 0]: mean 0.375, var (0.140625 + 0.015625 + 0.390625 + 0.140625) / 4
    assert col(s, "group_valid")[4:] == [4] * 4
    assert col(s, "group_mean")[4:] == [0.375] * 4
    assert col(s, "group_std")[4:] == approx([math.sqrt(0.171875)] * 4)
    assert col(s, "advantage")[4:] == [-0.375, 0.125, 0.625, -0.375]
    assert col(s, "best")[4:] == [False, False, True, False]
    assert col(s, "pass_at_1")[4:] == [0.25] * 4
    assert col(s, "reward")[7] == 0.8  # input untouched
    g = out.groups.to_pydict()
    assert (g["n"], g["n_valid"], g["n_failed"], g["n_correct"]) == ([4, 4], [4, 4], [0, 1], [2, 1])
    assert g["pass_at_4"] == [1.0, 1.0]


def test_a_failed_sample_is_not_correct_even_at_a_threshold_its_zero_meets() -> None:
    out = finalize(WITH_FAILED, FinalizeConfig(correct_threshold=0.0))
    assert col(out.groups, "n_correct") == [4, 3]


def test_failed_samples_can_be_marked_best() -> None:
    # Upstream quirk Q26: failed traces count as 0, so an all-zero group marks all best.
    table = make_table(["g", "g"], [0.0, None], ok=[True, False])
    out = finalize(table)
    assert col(out.samples, "best") == [True, True]


def test_null_or_nan_reward_counts_as_failed() -> None:
    out = finalize(make_table(["g"] * 3, [1.0, None, float("nan")]))
    assert col(out.groups, "n_failed") == [2]
    assert col(out.groups, "n_correct") == [1]
    assert col(out.samples, "best") == [True, False, False]


def test_an_all_failed_group_is_all_zero() -> None:
    out = finalize(make_table(["g", "g"], [1.0, 1.0], ok=[False, False]))
    g = out.groups.to_pydict()
    assert (g["n"], g["n_valid"], g["n_correct"]) == ([2], [2], [0])
    assert g["mean"] == g["std"] == g["best_reward"] == g["pass_at_1"] == [0.0]
    assert col(out.samples, "advantage") == [0.0, 0.0]


# (n, c) with 1 <= n <= 12 and 0 <= c <= n
n_c = st.tuples(st.integers(1, 12), st.integers(0, 12)).filter(lambda nc: nc[1] <= nc[0])


@settings(max_examples=25, deadline=None)
@given(st.lists(n_c, min_size=1, max_size=4))
def test_pass_at_k_matches_its_definition(cases: list[tuple[int, int]]) -> None:
    # Several (n, c) groups per finalize call, every k in 1..13 checked for each of them.
    ids: list[str] = []
    rewards: list[float] = []
    for g, (n, c) in enumerate(cases):
        ids += [f"g{g}"] * n
        rewards += [1.0] * c + [0.0] * (n - c)
    ks = tuple(range(1, 14))
    groups = finalize(make_table(ids, rewards), FinalizeConfig(pass_k=ks)).groups
    for g, (n, c) in enumerate(cases):
        outcomes = [1] * c + [0] * (n - c)
        for k in ks:
            got = groups[f"pass_at_{k}"][g].as_py()
            if k > n:
                assert got is None
                continue
            draws = list(itertools.combinations(outcomes, k))
            exact = sum(any(d) for d in draws) / len(draws)  # P(at least one correct of k)
            assert math.isclose(got, exact, rel_tol=1e-12, abs_tol=1e-12), (n, c, k)


def test_one_row_per_group_in_order_of_first_appearance() -> None:
    table = make_table(["z", "y", "z", "x", "y", "z"], [1.0, 0.0, 0.0, 1.0, 1.0, 0.5])
    g = finalize(table).groups
    assert col(g, "group_id") == ["z", "y", "x"]
    assert col(g, "n") == [3, 2, 1]


def test_chunked_and_dictionary_group_ids() -> None:
    halves = [TWO_GROUPS.slice(0, 3), TWO_GROUPS.slice(3)]
    chunked = pa.concat_tables(halves)
    assert chunked["group_id"].num_chunks == 2
    expected = finalize(TWO_GROUPS)
    assert finalize(chunked).groups.equals(expected.groups)
    as_dict = TWO_GROUPS.set_column(0, "group_id", TWO_GROUPS["group_id"].dictionary_encode())
    assert col(finalize(as_dict).groups, "mean") == col(expected.groups, "mean")


def test_judge_adds_columns_and_sees_each_group_once() -> None:
    seen: list[tuple[list[str], list[str]]] = []

    def judge(group: pa.Table):
        seen.append((col(group, "group_id"), col(group, "rollout_id")))
        assert "advantage" in group.column_names  # runs after statistics
        if group["group_id"][0].as_py() == "b":
            return None
        return {
            "reward_judge": [r * 10 for r in col(group, "reward")],
            "metric_one": np.ones(group.num_rows),
            "metric_neg": pc.negate(group["reward"]),  # an Arrow column is fine too
        }

    out = finalize(TWO_GROUPS, judge=judge)
    assert seen == [(["a"] * 4, ["r0", "r2", "r4", "r6"]), (["b"] * 4, ["r1", "r3", "r5", "r7"])]
    assert col(out.samples, "reward_judge") == [10.0, None, 0.0, None, 10.0, None, 0.0, None]
    assert col(out.samples, "metric_one") == [1.0, None] * 4
    assert col(out.samples, "metric_neg") == [-1.0, None, -0.0, None, -1.0, None, -0.0, None]
    assert out.samples.schema.field("reward_judge").type == pa.float64()


@pytest.mark.parametrize(
    "result, match",
    [
        ({"judge": [1.0] * 4}, r"'judge' must start with 'reward_' or 'metric_'"),
        ({"reward_judge": [1.0] * 3}, r"'reward_judge' has 3 values, expected 4"),
        ({"reward": [1.0] * 4}, r"'reward' must start with"),
        ({"reward_x": ["bad"] * 4}, r"'reward_x' is not numeric"),
        ({"reward_x": 1.0}, r"'reward_x' must be a sequence"),
        ([1.0] * 4, r"expected a mapping"),
    ],
)
def test_judge_bad_result_raises(result: object, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        finalize(TWO_GROUPS, judge=lambda group: result)
    assert "group 'a'" in str(info.value)


def test_a_judge_replaces_its_column_but_never_a_trace_tables() -> None:
    table = TWO_GROUPS.append_column("metric_x", pa.array([0.0] * 8))
    out = finalize(table, judge=lambda group: {"metric_x": [1.0] * group.num_rows})
    assert out.samples.column_names.count("metric_x") == 1 and col(out.samples, "metric_x") == [1.0] * 8
    with pytest.raises(ValueError, match="'reward_weights' is a column of every trace table"):
        finalize(TWO_GROUPS, judge=lambda group: {"reward_weights": [1.0] * group.num_rows})


def test_a_finalized_table_is_finalized_again_with_its_group_columns_replaced() -> None:
    """``finalize(read_run(dir))``: another pass@k or judge on a stored run (issue 19)."""
    done = finalize(TWO_GROUPS, FinalizeConfig(pass_k=(1, 2))).samples
    again = finalize(
        done, FinalizeConfig(pass_k=(4,), normalize_std=False), judge=lambda group: {"metric_j": [2.0] * group.num_rows}
    )
    fresh = finalize(TWO_GROUPS, FinalizeConfig(pass_k=(4,), normalize_std=False)).samples
    assert again.samples.column_names == [*fresh.column_names, "metric_j"]
    assert again.samples.drop_columns(["metric_j"]).equals(fresh)
    kept = finalize(again.samples).samples  # without a judge, the stored judge columns stay
    assert sorted(kept.column_names) == sorted([*finalize(TWO_GROUPS).samples.column_names, "metric_j"])


def test_input_validation() -> None:
    with pytest.raises(ValueError, match=r"lacks required column\(s\) \['reward'\]"):
        finalize(TWO_GROUPS.drop_columns(["reward"]))
    with pytest.raises(ValueError, match="group_id has nulls"):
        finalize(make_table(["a", None], [1.0, 0.0]))  # type: ignore[list-item]


def test_config_is_frozen_and_validated() -> None:
    config = FinalizeConfig()
    with pytest.raises(pydantic.ValidationError):
        config.eps = 0.1  # type: ignore[misc]
    bads = [{"pass_k": (0,)}, {"pass_k": (2, 2)}, {"failed": "mask"}, {"eps": -1.0}]  # one rule for failures
    for bad in [*bads, {"std_ddof": -1}, {"bogus": 1}]:
        with pytest.raises(pydantic.ValidationError):
            FinalizeConfig(**bad)
    assert "GRPO" in (FinalizeConfig.model_fields["normalize_std"].description or "")


def test_empty_table() -> None:
    out = finalize(TWO_GROUPS.slice(0, 0))
    assert out.samples.num_rows == 0 and out.groups.num_rows == 0


def test_large_table_is_vectorised() -> None:
    rng = np.random.default_rng(0)
    n_groups, n = 25_000, 4
    rows = n_groups * n
    table = pa.table(
        {
            "group_id": pa.array(rng.permutation(np.repeat(np.arange(n_groups), n))).cast(pa.string()),
            "sample_idx": pa.array(np.tile(np.arange(n, dtype=np.int32), n_groups)),
            "ok": pa.array(rng.random(rows) > 0.05),
            "reward": pa.array(rng.integers(0, 3, rows) / 2.0),
        }
    )
    start = time.perf_counter()
    out = finalize(table, FinalizeConfig(pass_k=(1, 2, 4)))
    print(f"finalize of {rows} rows / {n_groups} groups: {time.perf_counter() - start:.3f} s")
    assert out.samples.num_rows == rows
    assert out.groups.num_rows == n_groups
    assert sum(col(out.groups, "n")) == rows
