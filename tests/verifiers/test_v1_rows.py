"""A v1 row as ours: the fields we share mapped, the row's own kept, and a row asking for what
is not mapped yet refused in one line (issue 31 §1)."""

from __future__ import annotations

import pytest
import verifiers.v1 as vf

from rollout_ray import RolloutTimeouts
from rollout_ray._verifiers.task import V1Task, adapter_class


class QA(vf.TaskData):
    answer: str


class QATask(vf.Task[QA]):
    @vf.reward(weight=2.0, priority=1)
    async def exact(self, task: QA, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)


def test_the_shared_fields_are_mapped_and_the_rows_own_are_kept() -> None:
    data = QA(idx=4, id="q-4", name="four", prompt=[vf.UserMessage(content="2+2?")], system_prompt="Be brief.",
              timeout=vf.TaskTimeout(agent=30), network_allow=["pypi.org"], answer="4")
    task = adapter_class(QATask)(QATask(data))
    assert isinstance(task, V1Task) and type(task).__name__ == "QATask"
    assert task.data.model_dump(exclude={"network_block", "image"}) == {
        "idx": 4, "name": "four", "prompt": [{"role": "user", "content": "2+2?"}], "system_prompt": "Be brief.",
        "timeout": {"setup": None, "agent": 30.0, "finalize": None, "scoring": None}, "network_allow": ["pypi.org"], "id": "q-4", "description": None,
        "answer": "4"}
    assert task.data.timeout == RolloutTimeouts(agent=30)
    assert task.key == QATask(data).key
    (hook,) = task.hooks("reward")
    assert (hook.name, hook.weight, hook.priority) == ("exact", 2.0, 1)


def test_upstream_defaults_mean_no_policy_and_no_timeout() -> None:
    task = V1Task(QATask(QA(prompt="2+2?", answer="4")))
    assert (task.data.network_allow, task.data.network_block, task.data.timeout) == (None, None, None)
    assert not task.data.network_policy


@pytest.mark.parametrize(("update", "reason"), [
    ({"workdir": "/app"}, "its row sets workdir"),
    ({"agent_user": "agent"}, "its row sets agent_user"),
    ({"resources": vf.TaskResources(cpu=2)}, r"its row asks for resources \(cpu=2\.0 memory=None gpu=None disk=None\)"),
])
def test_a_row_asking_for_what_is_not_mapped_is_refused_in_one_line(update: dict[str, object], reason: str) -> None:
    upstream = QATask(QA(prompt="2+2?", answer="4").model_copy(update=update))
    with pytest.raises(ValueError, match=rf"^verifiers task QATask: not mapped onto rollout_ray yet: {reason}$"):
        V1Task(upstream)


def test_a_scorer_that_needs_the_runtime_is_refused() -> None:
    class Checks(vf.Task[QA]):
        @vf.reward
        async def file_exists(self, runtime: object) -> float:
            return 1.0

    with pytest.raises(ValueError, match=r"^verifiers task Checks: not mapped onto rollout_ray yet: @reward "
                                         r"file_exists needs the runtime$"):
        V1Task(Checks(QA(prompt="2+2?", answer="4")))
