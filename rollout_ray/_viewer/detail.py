"""One rollout for its page: its trace read from its shard, as JSON-ready data, and its siblings.

Only the row's shard is opened, only its row group holding the row is read (streamed), and only
the ``rollout_id`` and ``trace`` columns (with ``input_ids`` and ``logprobs``, where the blob left
its ids to them), a few rows at a time up to the row. Everything shown comes from the lossless
trace, so the page sees every field the rollout recorded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import ValidationError

from .._driver.finalize import FinalizeConfig, finalize
from .._errors import CorruptRun
from .._record.agent_branches import branch_owners
from .._record.messages import AssistantMessage, Content, ImagePart, ToolMessage, UserMessage
from .._record.run_layout import SAMPLES
from .._record.score_versions import rescored_trace
from .._record.store import unreadable_is_corrupt
from .._record.token_store import has_stored_ids, restore_ids
from .._record.trace import Trace, decode_trace
from .index import RunIndex
from .tokens_view import token_view

_BATCH = 16
"""Rows decoded at a time on the way to the row (traces can be MiBs each)."""
_BUFFER = 1 << 20
"""Bytes read from the shard at a time: the row group's trace column is streamed, not read whole."""


def read_trace(index: RunIndex, position: int) -> Trace:
    """Decode the trace of index row ``position`` from its shard.

    Raises:
        CorruptRun: the shard cannot be read, is a link, or its row is not the rollout the
            index says.
    """
    shard = int(index.table["_shard"][position].as_py())
    row = int(index.table["_row"][position].as_py())
    expected = index.table["rollout_id"][position].as_py()
    name = index.shard_name(shard)
    with index.layout.open() as run, run.folder(SAMPLES) as folder, folder.arrow_reader(name) as f:
        path = folder.path / name
        with unreadable_is_corrupt(path):
            blob, ids = _read_row(f, path, row, expected)
    trace = decode_trace(blob)
    if ids is not None and has_stored_ids(trace):  # the ids its token columns keep (schema 3 on)
        try:
            restore_ids(trace, *ids)
        except ValueError as e:
            raise CorruptRun.shard(path, f"row {row}: {e}") from None
    version = index.scores
    if version is not None and shard < version.shards:  # a rescore's scores, as the index shows them
        scored = version.row(
            index.table["group_id"][position].as_py(), index.table["sample_idx"][position].as_py(), expected
        )
        if scored is not None:
            trace = rescored_trace(trace, scored)
    return trace


def _read_row(
    source: pa.NativeFile, path: Path, row: int, rollout_id: str
) -> tuple[bytes, tuple[list[list[int]], list[list[float]]] | None]:
    """Row ``row``'s trace, and its ``input_ids`` and ``logprobs`` where the shard has them
    (the token view needs the ids a blob leaves to them): only its row group is read, streamed,
    and decoded ``_BATCH`` rows at a time up to the row (pyarrow reads no single row; the
    writer bounds a row group's bytes)."""
    with pq.ParquetFile(source, page_checksum_verification=True, pre_buffer=False, buffer_size=_BUFFER) as shard:
        first = 0
        for group in range(shard.num_row_groups):
            size = shard.metadata.row_group(group).num_rows
            if row < first + size:
                break
            first += size
        else:
            raise CorruptRun.shard(path, f"row {row} is past the shard's {first} rows")
        names = set(shard.schema_arrow.names)
        tokens = ["input_ids", "logprobs"] if {"input_ids", "logprobs"} <= names else []
        batches = shard.iter_batches(
            batch_size=_BATCH, row_groups=[group], columns=["rollout_id", "trace", *tokens], use_threads=False
        )
        for batch in batches:
            if row - first < batch.num_rows:
                at = row - first
                if batch.column(0)[at].as_py() != rollout_id:
                    raise CorruptRun.shard(path, f"row {row} is not rollout {rollout_id}; was the shard replaced?")
                blob = batch.column(1)[at].as_py()
                if blob is None:
                    raise CorruptRun.shard(path, f"row {row} has no trace")
                if not tokens or not batch.column(2)[at].is_valid:
                    return blob, None
                return blob, (batch.column(2)[at].as_py(), batch.column(3)[at].as_py())
            first += batch.num_rows
    raise CorruptRun.shard(path, f"row {row} not found")


def trace_view(trace: Trace, token_text: Callable[[int], str] | None = None) -> dict[str, Any]:
    """The rollout page's data: the last branch's conversation (and where each other branch
    leaves it), scores, spans, errors, calls, and its token sequences (each id's text too, with
    ``token_text``)."""
    counts = trace.counts()
    t0 = trace.timing.start or min((n.timestamp for n in trace.nodes if n.timestamp), default=0.0)
    return {
        "id": trace.id,
        "ok": trace.ok,
        "is_completed": trace.is_completed,
        "stop_condition": trace.stop_condition,
        "reward": trace.reward,
        "task": {
            "type": trace.task.type,
            "key": trace.task.key,
            "hash": trace.task.hash,
            "idx": trace.task.idx,
            "data": trace.task.data,
        },
        "agent": {
            "name": trace.agent.name,
            "harness": trace.agent.harness,
            "model": trace.agent.model,
            "runtime": None
            if trace.agent.runtime is None
            else {
                "id": trace.agent.runtime.id,
                "type": trace.agent.runtime.type,
                "name": trace.agent.runtime.name,
                "borrowed": trace.agent.runtime.borrowed,
            },
        },
        "counts": {
            "turns": counts.num_turns,
            "input_tokens": counts.num_input_tokens,
            "output_tokens": counts.num_output_tokens,
            "total_tokens": counts.num_total_tokens,
        },
        "num_branches": trace.num_branches,
        "messages": _conversation(trace, t0),
        "branch_reasons": trace.branch_reasons,
        "other_branches": _other_branches(trace, t0),
        "tokens": token_view(trace, token_text),
        "rewards": [
            {"name": k, "score": None if r is None else r.score, "weight": None if r is None else r.weight}
            for k, r in trace.rewards.items()
        ],
        "metrics": [{"name": k, "value": v} for k, v in trace.metrics.items()],
        "timing": _timing(trace, t0),
        "errors": [
            {"type": e.type, "message": e.message, "status_code": e.status_code, "traceback": e.traceback}
            for e in trace.errors
        ],
        "calls": [_call(c, t0) for c in trace.calls],
        "tool_calls": [
            {
                "server": c.server,
                "name": c.name,
                "arguments": _pretty(c.arguments),
                "ok": c.ok,
                "error": c.error,
                "duration": c.duration,
            }
            for c in trace.tool_calls
        ],
        "rewrites": {
            "request": [r.handler for r in trace.request_rewrites],
            "response": [r.handler for r in trace.response_rewrites],
        },
        "info": trace.info,
    }


def _conversation(trace: Trace, t0: float) -> list[dict[str, Any]]:
    branches = trace.branches
    return _entries(trace, branches[-1].nodes, 0, t0) if branches else []


def _other_branches(trace: Trace, t0: float) -> list[dict[str, Any]]:
    """Every branch but the last (the one ``messages`` shows), each from where it leaves the
    last one: a compacted agent's turns before its summary, a sub-agent's own conversation."""
    branches, reasons = trace.branches, trace.branch_reasons
    if len(branches) < 2:
        return []
    shown = branches[-1].nodes
    out = []
    for k, branch in enumerate(branches[:-1]):
        shared = 0
        while shared < min(len(branch.nodes), len(shown)) and branch.nodes[shared] == shown[shared]:
            shared += 1
        out.append(
            {
                "branch": k,
                "reason": reasons[k] if k < len(reasons) else None,
                "forks_after": branch.nodes[shared - 1] if shared else None,
                "messages": _entries(trace, branch.nodes, shared, t0),
            }
        )
    return out


def _entries(trace: Trace, path: tuple[int, ...], start: int, t0: float) -> list[dict[str, Any]]:
    """The messages of ``path[start:]``; a tool result names its tool, from the call it answers
    on the path, where the agent's API leaves the name off (Responses, Anthropic Messages)."""
    call_at = {c.node: c for c in trace.calls if c.node is not None}
    # Who said each user turn (tau2-bench#392: a simulator's faults must be told from the
    # agent's): a simulated user or another agent by name, else the task (its prompt).
    said_by = {t.node: t for t in trace.user_turns if t.node is not None}
    owners = branch_owners(trace)
    tool_names: dict[str, str] = {}
    out = []
    for position, i in enumerate(path):
        node = trace.nodes[i]
        message = node.message
        if isinstance(message, AssistantMessage):
            tool_names.update((c.id, c.name) for c in message.tool_calls or ())
        if position < start:
            continue
        entry: dict[str, Any] = {
            "node": i,
            "role": message.role,
            "text": _text(message.content),
            "sampled": node.sampled,
            "at": _rel(node.timestamp, t0),
        }
        if isinstance(message, AssistantMessage):
            entry["reasoning"] = message.reasoning_content
            entry["tool_calls"] = [
                {"id": c.id, "name": c.name, "arguments": _pretty(c.arguments)} for c in message.tool_calls or ()
            ]
        elif isinstance(message, ToolMessage):
            entry["tool_call_id"] = message.tool_call_id
            entry["name"] = message.name or tool_names.get(message.tool_call_id)
        elif isinstance(message, UserMessage):
            turn = said_by.get(i)
            entry["by"] = "task" if turn is None else turn.by
            entry["by_kind"] = "task" if turn is None else ("agent" if turn.agent_node is not None else "simulator")
        if node.sampled and owners:  # several policy agents: whose reply it is
            entry["agent"] = owners.get(i, trace.agent.name)
        if i in call_at:
            entry["call"] = _call(call_at[i], t0)
        out.append(entry)
    return out


def _text(content: Content | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, ImagePart):
            url = part.image_url.url
            parts.append(f"[image: {url[:80]}{'…' if len(url) > 80 else ''}]")
        else:
            parts.append(part.text)
    return "\n".join(parts)


def _pretty(arguments: str) -> str:
    """Tool-call arguments indented when they are JSON, as sent otherwise."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


def _rel(at: float, t0: float) -> float | None:
    return at - t0 if at and t0 else None


def _call(call: Any, t0: float) -> dict[str, Any]:
    usage = call.usage
    return {
        "node": call.node,
        "model": call.model,
        "finish_reason": call.finish_reason,
        "start": _rel(call.time.start, t0),
        "duration": call.time.duration,
        "usage": None
        if usage is None
        else {
            "input": usage.input_tokens,
            "output": usage.completion_tokens,
            "cached": usage.cached_input_tokens,
            "reasoning": usage.reasoning_tokens,
        },
        "error": None
        if call.error is None
        else {"type": call.error.type, "message": call.error.message, "status_code": call.error.status_code},
    }


def _timing(trace: Trace, t0: float) -> dict[str, Any]:
    spans: list[dict[str, Any]] = []
    for name, span in trace.timing.spans().items():
        if span.start:
            spans.append(
                {
                    "name": name,
                    "start": _rel(span.start, t0),
                    "end": _rel(span.end, t0) if span.end else None,
                    "duration": span.duration,
                }
            )
    agent = trace.timing.agent
    return {
        "spans": spans,
        "agent_model": agent.model.duration,
        "agent_harness": agent.harness.duration,
        "total": max((s["end"] or s["start"] for s in spans), default=0.0),
    }


_GROUP_COLUMNS = ("rollout_id", "sample_idx", "attempt", "ok", "reward", "stop_condition", "error_type")


def siblings(index: RunIndex, position: int, recorded: dict[str, Any] | None) -> dict[str, Any]:
    """The rows of the rollout's group with reward, ok and advantage.

    The stored ``advantage`` column when every shard has one; otherwise the group is finalized
    here, over its scalar rows, with the finalize settings the run recorded (``recorded``).
    """
    table = index.table
    group_id = table["group_id"][position].as_py()
    group = table.filter(pc.equal(table["group_id"], group_id))
    rows = group.select(list(_GROUP_COLUMNS)).to_pylist()
    if "advantage" in index.complete:
        source, advantages = "stored", group["advantage"].to_pylist()
    else:
        source, advantages = "computed", _computed_advantages(group, recorded)
    for row, advantage in zip(rows, advantages):
        row["advantage"] = advantage
    rewards = np.array([r["reward"] for r in rows if r["ok"] and r["reward"] is not None], dtype=float)
    return {
        "group_id": group_id,
        "advantage_source": source,
        "mean_reward": float(rewards.mean()) if rewards.size else None,
        "std_reward": float(rewards.std()) if rewards.size else None,
        "rows": rows,
    }


def _computed_advantages(group: pa.Table, recorded: dict[str, Any] | None) -> list[float | None]:
    try:
        config = FinalizeConfig.model_validate(recorded) if recorded else FinalizeConfig()
    except ValidationError:
        config = FinalizeConfig()  # settings of another version: the default still ranks the group
    # Only what finalize reads, so stored group columns cannot clash with the ones it adds.
    done = finalize(group.select(["rollout_id", "group_id", "ok", "reward"]), config)
    by_id = dict(zip(done.samples["rollout_id"].to_pylist(), done.samples["advantage"].to_pylist()))
    return [by_id.get(rid) for rid in group["rollout_id"].to_pylist()]  # a dropped group: None
