"""Run directories for the viewer's tests, written directly as a driver would store them.

Row ``i`` is sample ``i % 4`` of group ``i // 4``. It fails when ``i % 7 == 3`` (a
``ToolsetError`` or a ``ProviderError`` with a real traceback), stops on ``max_turns`` when
``i % 11 == 5``, and is rewarded 1.0 unless ``i % 3 == 0``. Row 1's conversation is hostile
markup, to check that the page shows it as text.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp

from rollout_ray._driver.run_dir import with_filter_columns
from rollout_ray._errors import ProviderError, ToolsetError
from rollout_ray._record.arrow import RolloutRecord, records_to_table
from rollout_ray._record.messages import AssistantMessage, SystemMessage, ToolCall, ToolMessage, Usage, UserMessage
from rollout_ray._record.store import Manifest, ShardWriter, write_manifest
from rollout_ray._record.trace import (
    AgentInfo,
    AgentSpan,
    ErrorRecord,
    MessageNode,
    ModelCall,
    Reward,
    RuntimeInfo,
    TimeSpan,
    TimeSplit,
    Timing,
    ToolCallRecord,
    Trace,
    TraceTask,
)
from rollout_ray._viewer.server import Viewer, start

SAMPLES = 4
HOSTILE = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script> & "quotes"'


def rollout_id(i: int) -> str:
    return hashlib.blake2b(f"rollout-{i}".encode(), digest_size=16).hexdigest()


def failed(i: int) -> bool:
    return i % 7 == 3


def _error(i: int) -> ErrorRecord:
    def call_tool() -> None:
        if i % 2:
            raise ToolsetError(f"tool 'add' crashed on rollout {i}")
        raise ProviderError(f"upstream answered 503 for rollout {i}", status_code=503)

    try:
        call_tool()
    except (ToolsetError, ProviderError) as exc:
        error = ErrorRecord.from_exception(exc)
    # A provider error keeps no traceback of its own (it would be ours); give it one to show.
    return (
        error
        if error.traceback
        else ErrorRecord(
            error.type, error.message, error.status_code, "Traceback (most recent call last):\n  upstream 503\n"
        )
    )


def make_trace(i: int, t: float = 1_750_000_000.0) -> Trace:
    """Row ``i``'s trace: system, user, a tool-calling turn, the tool's result, an answer."""
    a, b = 100 + i % 50, 7 + i % 13
    question = HOSTILE if i == 1 else f"What is {a} + {b}?"
    nodes = [
        MessageNode(None, SystemMessage("You add numbers with the calculator."), timestamp=t + 0.01),
        MessageNode(0, UserMessage(question), timestamp=t + 0.01),
        MessageNode(
            1,
            AssistantMessage(
                content=f"I'll add {a} and {b}.",
                reasoning_content="Use the tool.",
                tool_calls=[ToolCall(f"call_{i}", "add", f'{{"a": {a}, "b": {b}}}')],
            ),
            sampled=True,
            timestamp=t + 0.5,
        ),
        MessageNode(2, ToolMessage(f"call_{i}", str(a + b), name="add"), timestamp=t + 0.52),
    ]
    calls = [
        ModelCall(
            node=2,
            model="simulated",
            finish_reason="tool_calls",
            usage=Usage(prompt_tokens=40, completion_tokens=12),
            time=TimeSpan(t + 0.02, t + 0.5),
        )
    ]
    broken = failed(i)
    if not broken:
        nodes.append(MessageNode(3, AssistantMessage(content=f"The sum is {a + b}."), sampled=True, timestamp=t + 0.9))
        calls.append(
            ModelCall(
                node=4,
                model="simulated",
                finish_reason="stop",
                usage=Usage(prompt_tokens=60, completion_tokens=6),
                time=TimeSpan(t + 0.53, t + 0.9),
            )
        )
    stop = "error" if broken else ("max_turns" if i % 11 == 5 else "agent_completed")
    return Trace(
        id=rollout_id(i),
        task=TraceTask(
            type="Arith" if (i // SAMPLES) % 2 == 0 else "Calc",
            key=f"{i // SAMPLES:04d}" + "k" * 60,
            hash="0" * 64,
            idx=i // SAMPLES,
            data={"prompt": question, "answer": a + b},
        ),
        agent=AgentInfo(harness="chat", model="simulated", runtime=RuntimeInfo(id=f"rt-{i}", type="local", name="rt")),
        nodes=nodes,
        calls=calls,
        rewards={} if broken else {"correct": Reward(float(i % 3 != 0)), "format": Reward(1.0, 0.1)},
        metrics={} if broken else {"reply_chars": float(10 + i % 5)},
        is_completed=True,
        ok=not broken,
        stop_condition=stop,
        errors=[_error(i)] if broken else [],
        timing=Timing(
            start=t,
            boot=TimeSpan(t, t + 0.002),
            setup=TimeSpan(t + 0.002, t + 0.01),
            agent=AgentSpan(t + 0.01, t + 0.95, model=TimeSplit(0.85), harness=TimeSplit(0.09)),
            finalize=TimeSpan(t + 0.95, t + 0.96),
            scoring=TimeSpan(t + 0.96, t + 0.97),
        ),
        tool_calls=[
            ToolCallRecord(
                "calc", "add", f'{{"a":{a},"b":{b}}}', not broken, error="crashed" if broken else None, duration=0.02
            )
        ],
    )


def write_run(
    run_dir: Path,
    n: int,
    *,
    rows_per_shard: int = 1000,
    run_id: str = "run-test",
    config: dict | None = None,
    shape: Callable[[int, Trace], Trace] | None = None,
) -> Path:
    """A run directory of ``n`` rows (see the module docstring); returns ``run_dir``.

    ``shape(i, trace)``: row ``i``'s trace, changed; its rows are then stored as the driver
    stores them (with the task's data as ``data_<field>`` columns)."""
    write_manifest(
        run_dir, Manifest(run_id=run_id, config=config or {"taskset": "tests/arith.py", "model": "simulated"})
    )
    with ShardWriter(run_dir, rows_per_shard=rows_per_shard) as writer:
        for start in range(0, n, 1000):
            records = [
                RolloutRecord(
                    make_trace(i) if shape is None else shape(i, make_trace(i)),
                    run_id,
                    f"g{i // SAMPLES:05d}",
                    i % SAMPLES,
                )
                for i in range(start, min(n, start + 1000))
            ]
            table = records_to_table(records)
            writer.write(table if shape is None else with_filter_columns(table, {}))
    return run_dir


def serve_requests(viewer: Viewer, *requests: str | tuple[str, dict[str, str]]) -> list[tuple[int, Any]]:
    """GET each request (a path, or a path and its headers) from a server on a free port."""

    async def go() -> list[tuple[int, Any]]:
        runner, url = await start(viewer)
        try:
            async with aiohttp.ClientSession() as session:
                out = []
                for request in requests:
                    path, headers = request if isinstance(request, tuple) else (request, {})
                    async with session.get(url + path.lstrip("/"), headers=headers) as response:
                        body: Any = await response.read()
                        if response.content_type == "application/json":
                            body = json.loads(body)
                        out.append((response.status, body))
                return out
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def get(viewer: Viewer, path: str, **params: Any) -> Any:
    """The JSON of a GET that must succeed."""
    status, body = serve_requests(viewer, f"{path}?{urlencode(params)}")[0]
    assert status == 200, body
    return body
