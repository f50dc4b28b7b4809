"""``GET /task`` answers upstream's ``{"cls": "module:QualName", "task": "<json>"}`` (§5.4): a
tool server that only has the state secret rebuilds the rollout's row as the task made it."""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import aiohttp

from rollout_ray import HTTPInterception, RolloutSession, Task, TaskData, Trace
from rollout_ray.testing import ScriptedModel


class Row(TaskData):
    answer: int
    tags: list[str] = []


class RowTask(Task):
    data_type = Row


def test_the_task_route_answers_the_data_class_and_its_json_and_the_row_rebuilds() -> None:
    task = RowTask({"idx": 3, "prompt": "2+2?", "answer": 4, "tags": ["easy"]})
    session = RolloutSession(Trace(task=task.trace_task()), ScriptedModel(default="4"))

    async def main() -> Any:
        async with HTTPInterception() as server, server.serve(session) as slot, aiohttp.ClientSession() as client:
            async with client.get(
                f"{slot.base_url}/task", headers={"Authorization": f"Bearer {slot.state_secret}"}
            ) as resp:
                assert resp.status == 200
                return await resp.json()

    body = asyncio.run(main())
    assert body["cls"] == f"{__name__}:Row"
    module, qualname = body["cls"].split(":")
    cls = getattr(importlib.import_module(module), qualname)
    assert cls.model_validate_json(body["task"]) == task.data
