"""Settings that would do nothing say so: an empty prompt is refused where the task is made, an
interception given to an in-process harness is a warning, a misspelt sampling key is named."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from rollout_ray import LocalInterception, Task
from rollout_ray._core.sampling import SAMPLING_FIELDS, unknown_sampling
from rollout_ray.testing import ScriptedHarness

from conftest import EchoTask, make_rollout, run

EMPTY = r"the prompt is empty; give the opening user turn, or prompt=None when a user opens the conversation"


@pytest.mark.parametrize("prompt", ["", "  \n", []])
def test_an_empty_prompt_is_refused_where_the_task_is_made(prompt: Any) -> None:
    with pytest.raises(ValidationError, match=EMPTY):
        Task({"prompt": prompt})


@pytest.mark.parametrize("prompt", [None, "hi", [{"role": "user", "content": ""}]])
def test_a_prompt_or_none_or_an_explicit_empty_turn_is_taken(prompt: Any) -> None:
    assert Task({"prompt": prompt}).data.prompt == prompt


def test_an_interception_for_an_in_process_harness_is_a_warning() -> None:
    with pytest.warns(
        UserWarning,
        match=r"^Rollout: interception= is not used: the harness 'scripted' runs in "
        r"process and talks to its session directly$",
    ):
        rollout = make_rollout(
            EchoTask({"prompt": "hi"}), harness=ScriptedHarness(in_process=True), interception=LocalInterception()
        )
    assert run(rollout.run()).ok  # served in process, as before


def test_a_misspelt_sampling_key_is_named_with_the_known_one() -> None:
    assert unknown_sampling(["temperature", "temprature", "top-k", "maxtokens", "guided_json"]) == [
        ("temprature", "temperature"),
        ("top-k", "top_k"),
        ("maxtokens", "max_tokens"),
        ("guided_json", None),
    ]
    assert {"temperature", "top_p", "max_tokens", "seed", "top_k", "min_p", "repetition_penalty"} <= SAMPLING_FIELDS
