"""Group.batch: a finalized group as padded training arrays, checked against a hand-built example."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pytest

from rollout_ray import AssistantMessage, ChatHarness, Request, Response, Trace, TraceTask, UserMessage
from rollout_ray._core.model import Model
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._driver.finalize import FinalizeConfig, finalize
from rollout_ray._driver.group import Group
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._record.arrow import TOKEN_COLUMNS, RolloutRecord, records_to_table
from rollout_ray._record.openai_codec import wire_message
from rollout_ray._record.trace import MessageNode, ModelCall
from rollout_ray._simulated.template import render
from rollout_ray._simulated.tokenizer import IM_END, encode

from conftest import tasks


def sample(reward: float, *, ok: bool = True) -> Trace:
    trace = Trace(task=TraceTask("T"), ok=ok)
    trace.record_reward("r", reward)
    return trace


def two_turns() -> Trace:
    """prompt [1 2 3], sampled [10 11]; then [4] added, sampled [12]."""
    trace = sample(1.0)
    trace.nodes = [
        MessageNode(None, UserMessage("q")),
        MessageNode(0, AssistantMessage("a"), sampled=True, token_ids=[10, 11], logprobs=[-0.5, -0.25]),
        MessageNode(1, UserMessage("more")),
        MessageNode(2, AssistantMessage("b"), sampled=True, token_ids=[12], logprobs=[-1.0]),
    ]
    trace.calls = [ModelCall(node=1, prompt_ids=[1, 2, 3]), ModelCall(node=3, prompt_shared=5, prompt_ids=[4])]
    return trace


def two_branches(reward: float = 0.0, *, ok: bool = True) -> Trace:
    """prompt [1 2], sampled [20] on one branch and [21 22] on another."""
    trace = sample(reward, ok=ok)
    trace.nodes = [
        MessageNode(None, UserMessage("q")),
        MessageNode(0, AssistantMessage("A"), sampled=True, token_ids=[20], logprobs=[-2.0]),
        MessageNode(0, AssistantMessage("B"), sampled=True, token_ids=[21, 22], logprobs=[-0.125, -0.25]),
    ]
    trace.calls = [ModelCall(node=1, prompt_ids=[1, 2]), ModelCall(node=2, prompt_ids=[1, 2])]
    return trace


def group() -> Group:
    """Four samples: two turns (reward 1), two branches (reward 0), a failed one (counted as 0,
    not batched) and one without token ids (reward 0.5). Advantages r - mean: 0.625, -0.375,
    -0.375 (not batched), 0.125."""
    traces = [two_turns(), two_branches(), two_branches(1.0, ok=False), sample(0.5)]
    table = records_to_table([RolloutRecord(t, "run", "g", i) for i, t in enumerate(traces)])
    samples = finalize(table, FinalizeConfig(normalize_std=False)).samples
    return Group("g", samples, samples.slice(0, 0))


def test_a_group_batches_one_row_per_sequence_padded_to_the_longest() -> None:
    batch = group().batch()
    expected = {
        "input_ids": [[1, 2, 3, 10, 11, 4, 12], [1, 2, 20, 0, 0, 0, 0], [1, 2, 21, 22, 0, 0, 0]],
        "attention_mask": [[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0]],
        "loss_mask": [[0, 0, 0, 1, 1, 0, 1], [0, 0, 1, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0, 0]],
        "old_logprobs": [[0, 0, 0, -0.5, -0.25, 0, -1.0], [0, 0, -2.0, 0, 0, 0, 0], [0, 0, -0.125, -0.25, 0, 0, 0]],
        "advantages": [[0, 0, 0, 0.625, 0.625, 0, 0.625], [0, 0, -0.375, 0, 0, 0, 0], [0, 0, -0.375, -0.375, 0, 0, 0]],
        "sample_idx": [0, 1, 1],
        "branch": [0, 0, 1],
        "agent": ["agent", "agent", "agent"],  # one agent: the rollout's own
        "masked": ["", "", ""],
    }
    assert set(batch) == set(expected)
    for name, values in expected.items():
        np.testing.assert_array_equal(batch[name], np.array(values), err_msg=name)
    dtypes = {name: array.dtype for name, array in batch.items()}
    assert dtypes == {
        "input_ids": np.int64,
        "attention_mask": np.int64,
        "loss_mask": np.float32,
        "old_logprobs": np.float32,
        "advantages": np.float32,
        "sample_idx": np.int64,
        "branch": np.int64,
        "agent": np.dtype("<U5"),
        "masked": np.dtype("<U1"),
    }


def test_pad_to_and_pad_id_set_the_width_and_the_padding() -> None:
    batch = group().batch(pad_to=9, pad_id=-1)
    assert batch["input_ids"].shape == (3, 9)
    np.testing.assert_array_equal(batch["input_ids"][1], [1, 2, 20, -1, -1, -1, -1, -1, -1])
    assert batch["attention_mask"].sum() == 7 + 3 + 4


def test_a_sequence_longer_than_pad_to_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"^sample 0 \(branch 0\) has a sequence of 7 ids, more than pad_to=6"):
        group().batch(pad_to=6)
    with pytest.raises(ValueError, match=r"^`pad_to` must be >= 1 or None, got 0$"):
        group().batch(pad_to=0)


def test_a_group_without_token_ids_batches_to_empty_arrays() -> None:
    table = records_to_table([RolloutRecord(sample(r), "run", "g", i) for i, r in enumerate((0.0, 1.0))])
    samples = finalize(table, FinalizeConfig()).samples
    batch = Group("g", samples, samples.slice(0, 0)).batch(pad_to=4)
    assert {name: array.shape for name, array in batch.items()} == {
        "input_ids": (0, 4),
        "attention_mask": (0, 4),
        "loss_mask": (0, 4),
        "old_logprobs": (0, 4),
        "advantages": (0, 4),
        "sample_idx": (0,),
        "branch": (0,),
        "agent": (0,),
        "masked": (0,),
    }


def test_a_masked_sample_keeps_its_rows_with_no_loss_and_says_why() -> None:
    """Sample 1 (two branches) was stale: its reward 0 still counted in the mean (the
    advantages of the others are those of ``group()``), its rows train nothing."""
    samples = group().samples
    samples = samples.append_column("masked", pa.array([None, "stale", None, None], pa.string()))
    batch = Group("g", samples, samples.slice(0, 0)).batch()
    assert batch["masked"].tolist() == ["", "stale", "stale"] and batch["sample_idx"].tolist() == [0, 1, 1]
    assert batch["loss_mask"][1:].sum() == 0 and batch["advantages"][1:].sum() == 0
    np.testing.assert_array_equal(batch["input_ids"], group().batch()["input_ids"])
    np.testing.assert_array_equal(batch["advantages"][0], group().batch()["advantages"][0])
    np.testing.assert_array_equal(batch["old_logprobs"], group().batch()["old_logprobs"])


def test_samples_without_token_columns_are_refused() -> None:
    samples = group().samples.drop_columns(list(TOKEN_COLUMNS))
    with pytest.raises(ValueError, match=r"^samples lack the column\(s\) input_ids, loss_mask, logprobs, token_branch"):
        Group("g", samples, pa.table({})).batch()


def test_rows_split_across_chunks_batch_alike() -> None:
    samples = group().samples
    chunked = pa.concat_tables([samples.slice(0, 1), samples.slice(1)])
    for name, array in Group("g", chunked, samples.slice(0, 0)).batch().items():
        np.testing.assert_array_equal(array, group().batch()[name], err_msg=name)


class CapturingModel(Model):
    """Says "4" or "5" in turn, with the simulated server's template ids and made-up logprobs."""

    name = "capturing"
    shareable = True

    def __init__(self) -> None:
        self.count = 0

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Response:
        self.count += 1
        answer = "4" if self.count % 2 else "5"
        prompt = render([msgspec.to_builtins(wire_message(m)) for m in request.messages])
        ids = [*encode(answer), IM_END]
        return Response(
            AssistantMessage(answer),
            prompt_token_ids=prompt,
            token_ids=ids,
            token_logprobs=[-0.5] * len(ids),
            policy_version=1,
        )


def test_the_driver_stream_hands_on_groups_that_batch() -> None:
    async def main() -> list[dict[str, np.ndarray]]:
        async with LocalExecutor() as executor:
            driver = Driver(
                tasks(2),
                ChatHarness(retries=0),
                CapturingModel(),
                executor=executor,
                config=EvalConfig(samples_per_task=4, max_in_flight=1),
            )
            return [group.batch(pad_to=64) async for group in driver.groups()]

    batches = asyncio.run(main())
    assert len(batches) == 2
    for batch in batches:
        assert batch["input_ids"].shape == (4, 64)
        assert batch["loss_mask"].sum(axis=1).tolist() == [2.0] * 4  # the answer and <|im_end|>
        said = batch["input_ids"][batch["loss_mask"] == 1].reshape(4, 2)[:, 0]
        signs = np.sign(batch["advantages"].sum(axis=1))
        assert (signs == np.where(said == encode("4")[0], 1, -1)).all()  # "4" is rewarded
        np.testing.assert_array_equal(batch["old_logprobs"][batch["loss_mask"] == 1], -0.5)
