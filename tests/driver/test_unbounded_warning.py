"""A library run with no turn, token or time limit is warned about (issue 21 §6): an agent
that never stops would run forever under ``EvalConfig()``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rollout_ray import ChatHarness, LocalExecutor
from rollout_ray._core.limits import RolloutLimits, RolloutTimeouts
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray.testing import ScriptedModel

from conftest import tasks

UNBOUNDED = "EvalConfig sets no turn, token or time limit: an agent that never stops runs forever"


def _drive(config: EvalConfig) -> None:
    async def main() -> None:
        async with LocalExecutor() as executor:
            await Driver(
                tasks(1), ChatHarness(retries=0), ScriptedModel(default="4"), executor=executor, config=config
            ).arun()

    asyncio.run(main())


def test_a_run_without_any_limit_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    _drive(EvalConfig())
    (warned,) = [r for r in caplog.records if UNBOUNDED in r.getMessage()]
    assert warned.levelname == "WARNING"
    assert "limits=RolloutLimits(max_turns=...) or timeouts=RolloutTimeouts(agent=...)" in warned.getMessage()


@pytest.mark.parametrize(
    "config",
    [
        EvalConfig(limits=RolloutLimits(max_turns=8)),
        EvalConfig(limits=RolloutLimits(max_total_tokens=4096)),
        EvalConfig(timeouts=RolloutTimeouts(agent=60)),
    ],
    ids=["turns", "tokens", "time"],
)
def test_one_bound_is_enough(caplog: pytest.LogCaptureFixture, config: Any) -> None:
    _drive(config)
    assert not [r for r in caplog.records if UNBOUNDED in r.getMessage()]
