"""``Driver.run()``, the run for callers without an event loop, and models closed by ``async with``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rollout_ray import ChatHarness, OpenAIModel, Request, UserMessage
from rollout_ray._driver.driver import Driver
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray.testing import ScriptedModel

from conftest import tasks


@pytest.fixture
def model_url() -> Iterator[str]:
    """A simulated model server in its own process (``Driver.run`` needs no loop of ours)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollout_ray", "serve-model", "--port", "0", "--ttft", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("simulated model serving at http://127.0.0.1:"), line
        yield line.rsplit(" ", 1)[1].strip()
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]


def test_run_inside_async_code_says_to_await_arun() -> None:
    async def main() -> None:
        driver = Driver(tasks(1), ChatHarness(), ScriptedModel(default="4"), executor=LocalExecutor())
        with pytest.raises(
            RuntimeError,
            match=r"^Driver\.run\(\) cannot be called from a running event loop; "
            r"use 'await driver\.arun\(\)'$",
        ):
            driver.run()

    asyncio.run(main())


def test_run_starts_its_executor_and_leaves_the_model_usable_for_the_next_run(model_url: str) -> None:
    """Each run's loop ends with it: the executor is started and stopped on it, and the model's
    connections (bound to it) are released, so the same model serves the next run."""
    model = OpenAIModel(model_url, name="simulated", retries=0)
    for _ in range(2):
        result = Driver(tasks(2), ChatHarness(retries=0), model, executor=LocalExecutor(runtime="local")).run()
        assert result.samples["error_type"].to_pylist() == [None, None]
        assert model._session is None


def test_a_model_is_an_async_context_manager_that_closes_its_connections(model_url: str) -> None:
    async def main() -> OpenAIModel:
        async with OpenAIModel(model_url, name="simulated") as model:
            reply = await model.complete(Request([UserMessage("What is 17 + 25?")]), model=None, sampling={})
            assert reply.message.content == "42"
            assert model._session is not None
        return model

    assert asyncio.run(main())._session is None


def test_the_readme_pattern_leaves_no_unclosed_session_at_exit(model_url: str) -> None:
    """The warning a leaked client prints at exit (aiohttp's ``Unclosed client session``)."""
    code = f"""
import asyncio
from rollout_ray import OpenAIModel, Request, UserMessage

async def main():
    async with OpenAIModel({model_url!r}, name="simulated") as model:
        await model.complete(Request([UserMessage("What is 1 + 1?")]), model=None, sampling={{}})
asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-W", "error::ResourceWarning", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Unclosed" not in done.stderr, done.stderr
