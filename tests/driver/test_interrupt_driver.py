"""``Driver.paused(version, interrupt=True)`` on the LocalExecutor (issue 22 §1): the block runs
once no call is generating at the server; the weights are loaded there (``reload_weights``,
the simulated model's vLLM routes); every rollout's call continues under the new version and
its tokens say which version sampled them, down to the stored columns."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from rollout_ray import ChatHarness, LocalExecutor
from rollout_ray._record.trace import decode_trace

sys.path.insert(0, str(Path(__file__).parents[1] / "serving"))
from interrupt_rig import check_continued, update_mid_generation

from conftest import tasks


def run(interrupt: bool) -> Any:
    async def main() -> Any:
        async with LocalExecutor(runtime="local") as executor:
            return await update_mid_generation(executor, tasks(4), ChatHarness(retries=0), interrupt=interrupt)

    return asyncio.run(main())


def test_an_interrupting_update_continues_every_call_under_the_new_version() -> None:
    result, generating, server = run(interrupt=True)
    assert generating == [0] and server.policy_version == 4  # the block began with nothing generating
    check_continued(result.samples)


def test_without_interrupt_the_calls_finish_under_the_old_version() -> None:
    result, generating, _ = run(interrupt=False)
    assert generating == [4]  # they were still generating
    samples = result.samples
    assert samples["policy_max"].to_pylist() == [3] * 4
    assert all(decode_trace(b).calls[0].interrupts == 0 for b in samples["trace"].to_pylist())
