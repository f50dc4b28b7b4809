"""Data a user passes is never dropped silently: a task data key that is not a field, and a
misspelt key in any config a user fills, is refused where it is given, naming the key."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from rollout_ray import EvalConfig, RolloutLimits, RolloutTimeouts, SimulatedModelConfig, Task, TaskData
from rollout_ray._core.task import PluggedReward, TaskConfig


class MathData(TaskData):
    answer: int


class MathTask(Task):
    data_type = MathData


def test_a_key_the_data_class_lacks_is_refused_in_one_line_naming_it_and_what_to_declare() -> None:
    with pytest.raises(
        ValueError,
        match=r"^Task: task data key 'answer' is not a field of TaskData; declare it on a "
        r"TaskData subclass \(class MyData\(TaskData\): answer: \.\.\.\) and set "
        r"Task\.data_type = MyData$",
    ):
        Task({"prompt": "2+2?", "answer": 4})


def test_a_subclass_names_its_own_data_class() -> None:
    with pytest.raises(ValueError, match=r"^MathTask: task data key 'anwser' is not a field of MathData;"):
        MathTask({"prompt": "2+2?", "answer": 4, "anwser": 4})


def test_a_declared_key_is_kept() -> None:
    assert MathTask({"prompt": "2+2?", "answer": 4}).data.answer == 4  # type: ignore[attr-defined]


def test_task_data_built_directly_refuses_an_unknown_key() -> None:
    with pytest.raises(ValidationError, match=r"answer\n  Extra inputs are not permitted"):
        TaskData(prompt="2+2?", answer=4)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("model", "raw", "where"),
    [
        (EvalConfig, {"sample_per_task": 4}, "sample_per_task"),
        (EvalConfig, {"limits": {"max_turn": 3}}, r"limits\.max_turn"),
        (EvalConfig, {"timeouts": {"agnet": 3.0}}, r"timeouts\.agnet"),
        (EvalConfig, {"finalize": {"pass_at": [1]}}, r"finalize\.pass_at"),
        (SimulatedModelConfig, {"temprature_error": 0.1}, "temprature_error"),
        (TaskConfig, {"reward": {}}, "reward"),
        (PluggedReward, {"wieght": 2.0}, "wieght"),
        (MathData, {"answer": 4, "timeout": {"agnet": 1.0}}, r"timeout\.agnet"),
    ],
)
def test_a_misspelt_config_key_is_an_error_at_its_location(model: Any, raw: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError, match=rf"(?m)^{where}\n"):
        model.model_validate(raw)


@pytest.mark.parametrize("cls", [RolloutLimits, RolloutTimeouts])
def test_limits_and_timeouts_built_directly_refuse_a_misspelt_key(cls: Any) -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'max_turn'"):
        cls(max_turn=3)
