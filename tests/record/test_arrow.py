"""Trace ⇄ Arrow: lossless round trips through Parquet, derived scalar columns, the schema."""

from __future__ import annotations

from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout_ray import (
    AgentInfo,
    AgentSpan,
    AssistantMessage,
    ErrorRecord,
    ImagePart,
    InterceptRecord,
    MessageNode,
    ModelCall,
    Reward,
    RuntimeInfo,
    SystemMessage,
    TextPart,
    TimeSpan,
    TimeSplit,
    Timing,
    Tool,
    ToolCall,
    ToolCallRecord,
    ToolMessage,
    Trace,
    TraceTask,
    Usage,
    UserMessage,
    UserTurn,
    VersionInfo,
)
from rollout_ray._record.arrow import (
    AGENT_COLUMNS,
    ARROW_SCHEMA_VERSION,
    BRANCH_COLUMNS,
    CONVERSATION_COLUMNS,
    HISTORY_COLUMNS,
    POLICY_COLUMNS,
    SCALAR_COLUMNS,
    TOKEN_COLUMNS,
    TRACE_SCHEMA,
    RolloutRecord,
    SchemaMismatch,
    check_schema,
    records_to_table,
    table_to_records,
    table_to_traces,
)
from rollout_ray._record.messages import ImageURL
from rollout_ray._record.openai_codec import parse_request


def full_trace() -> Trace:
    """Every field of every nested struct non-default; two branches sharing a prefix."""
    tool_call = ToolCall(id="c1", name="grep", arguments='{"q": 1}')
    return Trace(
        version=2,
        id="trace-1",
        task=TraceTask(
            "MathTask",
            key="k",
            hash="h" * 64,
            idx=7,
            data={"prompt": "p", "n": [1, 2.5]},
            data_cls="tasks:MathData",
        ),
        agent=AgentInfo(
            harness="scripted",
            model="m-1",
            runtime=RuntimeInfo(
                id="/tmp/x", type="memory", name="rt", borrowed=True, image="sha256:ab", snapshot="cd.1"
            ),
            name="solver",
            trainable=False,
        ),
        tools=[Tool(name="grep", description="search", parameters={"type": "object"}, strict=True)],
        nodes=[
            MessageNode(None, SystemMessage("sys"), timestamp=1.5),
            MessageNode(0, UserMessage([TextPart("look"), ImagePart(ImageURL("data:,AA"))])),
            MessageNode(1, AssistantMessage(content="prompt-supplied")),
            MessageNode(2, UserMessage("go")),
            MessageNode(
                3,
                AssistantMessage(content=[TextPart("ok ")], reasoning_content="hmm", tool_calls=[tool_call]),
                sampled=True,
                timestamp=3.0,
                token_ids=[1, 2, 3],
                logprobs=[-0.5, -0.25, 0.0],
                advantages=[0.5, 0.5, 0.5],
                mask=[True, True, False],
                is_content=[False, True, True],
            ),
            MessageNode(
                4,
                ToolMessage(tool_call_id="c1", content="found", name="grep"),
                original_chars=9000,
                original_digest=b"\x01" * 16,
            ),
            MessageNode(5, AssistantMessage(content="A"), sampled=True, token_ids=[4], logprobs=[-1.0]),
            MessageNode(5, AssistantMessage(content="B"), sampled=True),
        ],
        calls=[
            ModelCall(
                node=4,
                model="m-1",
                sampling={"temperature": 0.7, "max_tokens": 64},
                endpoint="/chat/completions",
                finish_reason="tool_calls",
                usage=Usage(
                    prompt_tokens=10, completion_tokens=4, cached_input_tokens=2, reasoning_tokens=1, cost=0.125
                ),
                time=TimeSpan(10.0, 12.5),
                error=ErrorRecord(type="ProviderError", message="slow", status_code=429, traceback="tb"),
                policy=3,
                prompt_shared=0,
                prompt_ids=[7, 8],
                token_policy=[(3, 2), (4, 1)],
                interrupts=1,
                dropped={"logit_bias": "not forwarded"},
                tools_digest="0123456789abcdef",
            ),
            ModelCall(node=6, usage=Usage(prompt_tokens=20, completion_tokens=5), prompt_shared=5, prompt_ids=[9]),
            ModelCall(node=7, usage=Usage(prompt_tokens=22, completion_tokens=3)),
            # stored_ids is a blob's own: kept as it is on a call that sampled no node
            ModelCall(error=ErrorRecord(type="ProviderError", message="down", status_code=503), stored_ids=(1, 2)),
        ],
        request_rewrites=[InterceptRecord("redact")],
        response_rewrites=[InterceptRecord("censor")],
        rewards={"correct": Reward(0.5, weight=2.0), "style": Reward(1.0, 0.5), "judge": None},
        metrics={"turns": 3.0, "unscored": None},
        info={"judge": [{"text": "yes", "parsed": True}], "n": 3, "x": None},
        is_completed=True,
        ok=True,
        stop_condition="max_turns",
        errors=[
            ErrorRecord(type="HarnessError", message="first"),
            ErrorRecord(
                type="TaskError",
                message="bad",
                status_code=502,
                traceback="Traceback...",
                lineage=["TaskError", "RolloutError", "Exception", "BaseException"],
            ),
        ],
        timing=Timing(
            start=100.0,
            boot=TimeSpan(100.5, 101.0),
            setup=TimeSpan(101.0, 102.0),
            agent=AgentSpan(102.0, 110.0, model=TimeSplit(3.0), harness=TimeSplit(5.0)),
            finalize=TimeSpan(110.0, 111.25),
            scoring=TimeSpan(111.25, 112.0),
        ),
        tool_calls=[
            ToolCallRecord("calc", "add", '{"a": 1}', False, error="boom", duration=0.5, arguments_chars=90),
            ToolCallRecord("calc", "mul", "{}", True),
        ],
        extra_usage=[Usage(prompt_tokens=7, completion_tokens=2)],
        verifiers=VersionInfo(version="9.9.9", commit="abc123"),
        user_turns=[
            UserTurn(
                "customer",
                "go",
                node=3,
                call=ModelCall(model="judge", usage=Usage(prompt_tokens=5, completion_tokens=2)),
            ),
            UserTurn("player_b", "B", done=True, agent_node=7),
        ],
        state={"count": 2, "seen": ["a", None]},
    )


def full_record() -> RolloutRecord:
    return RolloutRecord(full_trace(), run_id="run-1", group_id="g-3", sample_idx=2, attempt=1)


def _struct_classes(info: object, seen: set[type]) -> set[type]:
    """Every Struct class reachable from a msgspec type description."""
    mi = msgspec.inspect
    if isinstance(info, mi.StructType):
        if info.cls not in seen:
            seen.add(info.cls)
            for f in info.fields:
                _struct_classes(f.type, seen)
    elif isinstance(info, (mi.ListType, mi.DictType, mi.UnionType)):
        for child in (getattr(info, a, None) for a in ("item_type", "key_type", "value_type")):
            if child is not None:
                _struct_classes(child, seen)
        for t in getattr(info, "types", ()):
            _struct_classes(t, seen)
    return seen


def _non_default_fields(value: object, found: set[tuple[type, str]]) -> None:
    """Collect (class, field) for every struct field holding a non-default value."""
    if isinstance(value, msgspec.Struct):
        for f in msgspec.structs.fields(value):
            v = getattr(value, f.name)
            factory = f.default_factory
            default = factory() if factory is not msgspec.NODEFAULT else f.default
            if default is msgspec.NODEFAULT or v != default:
                found.add((type(value), f.name))
            _non_default_fields(v, found)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _non_default_fields(v, found)
    elif isinstance(value, dict):
        for v in value.values():
            _non_default_fields(v, found)


def test_the_fixture_sets_every_field_of_every_reachable_struct() -> None:
    classes = _struct_classes(msgspec.inspect.type_info(Trace), set())
    wanted = {(c, f.name) for c in classes for f in msgspec.structs.fields(c)}
    found: set[tuple[type, str]] = set()
    _non_default_fields(full_trace(), found)
    assert wanted - found == set()


def test_every_trace_field_survives_arrow_and_parquet(tmp_path: Any) -> None:
    original = full_trace()
    table = records_to_table([full_record()])
    pq.write_table(table, tmp_path / "t.parquet", compression="zstd")
    with pq.ParquetFile(tmp_path / "t.parquet") as f:  # read_table imports pyarrow.dataset: 0.4 s
        back = f.read()
    assert back.equals(table)
    [decoded] = table_to_traces(back)
    assert decoded == original
    assert table_to_records(back) == [full_record()]


def test_scalar_columns_equal_the_trace_aggregates() -> None:
    trace = full_trace()
    [row] = records_to_table([full_record()]).select(list(SCALAR_COLUMNS)).to_pylist()
    assert row == {
        "run_id": "run-1",
        "rollout_id": "trace-1",
        "group_id": "g-3",
        "sample_idx": 2,
        "attempt": 1,
        "task_type": "MathTask",
        "task_key": "k",
        "task_hash": "h" * 64,
        "task_idx": 7,
        "ok": True,
        "is_completed": True,
        "stop_condition": "max_turns",
        "error_type": "TaskError",
        "error_message": "bad",
        "num_errors": 2,
        "reward": 1.5,
        "rewards": [("correct", 0.5), ("style", 1.0), ("judge", None)],
        "reward_weights": [("correct", 2.0), ("style", 0.5), ("judge", None)],
        "metrics": [("turns", 3.0), ("unscored", None)],
        "num_turns": 3,
        "num_input_tokens": 22,
        "num_output_tokens": 16,
        "num_total_tokens": 50,
        "num_tool_calls": 2,
        "started_at": 100.0,
        "boot_s": 0.5,
        "setup_s": 1.0,
        "agent_s": 8.0,
        "agent_model_s": 3.0,
        "agent_harness_s": 5.0,
        "finalize_s": 1.25,
        "scoring_s": 0.75,
    }
    # The same numbers as the Trace's own properties (the column-wise path recomputes them).
    assert (row["reward"], row["num_turns"]) == (trace.reward, trace.num_turns)
    assert (row["num_input_tokens"], row["num_output_tokens"], row["num_total_tokens"]) == (
        trace.num_input_tokens,
        trace.num_output_tokens,
        trace.num_total_tokens,
    )


def test_none_rewards_and_metrics_are_null_map_values() -> None:
    table = records_to_table([full_record()])
    for name, key in (("rewards", "judge"), ("reward_weights", "judge"), ("metrics", "unscored")):
        entries = table.column(name).combine_chunks()
        keys = entries.keys.to_pylist()
        assert entries.items.is_null().to_pylist()[keys.index(key)] is True
        assert entries.items.null_count == 1


def test_messages_column_is_the_last_branch_as_openai_json() -> None:
    trace = full_trace()
    [text] = records_to_table([full_record()]).column("messages").to_pylist()
    request = parse_request(msgspec.json.encode({"messages": msgspec.json.decode(text)}))[0]
    assert request.messages == trace.messages  # OpenAI wire shape, lossless for messages
    assert [m["role"] for m in msgspec.json.decode(text)] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert msgspec.json.decode(text)[-1]["content"] == "B"


def test_an_empty_trace_has_zero_aggregates_and_null_error() -> None:
    record = RolloutRecord(Trace(task=TraceTask("T"), id="e"), "r", "g", 0)
    [row] = records_to_table([record]).to_pylist()
    assert {
        k: row[k] for k in ("task_key", "task_idx", "stop_condition", "error_type", "error_message", "messages")
    } == {
        "task_key": None,
        "task_idx": None,
        "stop_condition": None,
        "error_type": None,
        "error_message": None,
        "messages": "[]",
    }
    assert (row["num_turns"], row["num_input_tokens"], row["num_total_tokens"], row["reward"]) == (
        0,
        0,
        0,
        0.0,
    )
    assert row["rewards"] == [] and row["metrics"] == []


def test_many_records_convert_in_order() -> None:
    records = [RolloutRecord(Trace(task=TraceTask("T", idx=i), id=f"t{i}"), "r", f"g{i // 2}", i % 2) for i in range(5)]
    table = records_to_table(records)
    assert table.column("rollout_id").to_pylist() == ["t0", "t1", "t2", "t3", "t4"]
    assert table.column("group_id").to_pylist() == ["g0", "g0", "g1", "g1", "g2"]
    assert table_to_records(table) == records


def test_no_records_give_an_empty_table_of_the_schema() -> None:
    table = records_to_table([])
    assert table.num_rows == 0
    assert table.schema.equals(TRACE_SCHEMA, check_metadata=True)


V1_COLUMNS = (
    "run_id",
    "rollout_id",
    "group_id",
    "sample_idx",
    "attempt",
    "task_type",
    "task_key",
    "task_hash",
    "task_idx",
    "ok",
    "is_completed",
    "stop_condition",
    "error_type",
    "error_message",
    "num_errors",
    "reward",
    "rewards",
    "reward_weights",
    "metrics",
    "num_turns",
    "num_input_tokens",
    "num_output_tokens",
    "num_total_tokens",
    "num_tool_calls",
    "started_at",
    "boot_s",
    "setup_s",
    "agent_s",
    "agent_model_s",
    "agent_harness_s",
    "finalize_s",
    "scoring_s",
    "messages",
    "trace",
)
"""Version 1's columns in order: the schema may only append after these."""


V2_COLUMNS = V1_COLUMNS + ("input_ids", "loss_mask", "logprobs", "token_branch", "token_drift")
"""Version 2 appended the token columns."""

V3_COLUMNS = V2_COLUMNS + ("attempts",)
"""Version 3 appended every attempt's errors."""

V4_COLUMNS = V3_COLUMNS + ("token_policy", "policy_min", "policy_max")
"""Version 4 appended the policy version of each id and the rollout's oldest and newest."""

V5_COLUMNS = V4_COLUMNS + ("branches", "branch_reasons")
"""Version 5 appended how many branches the conversation has and why each exists."""

V6_COLUMNS = V5_COLUMNS + ("token_agent", "agent_rewards")
"""Version 6 appended each sequence's agent and each agent's reward."""


def test_schema_is_versioned_and_only_appends() -> None:
    assert ARROW_SCHEMA_VERSION == 6  # 6: each sequence's agent, each agent's reward
    assert TRACE_SCHEMA.metadata == {b"rollout_ray.schema_version": b"6"}
    assert tuple(TRACE_SCHEMA.names) == V6_COLUMNS
    every = SCALAR_COLUMNS + CONVERSATION_COLUMNS + HISTORY_COLUMNS + POLICY_COLUMNS + BRANCH_COLUMNS + AGENT_COLUMNS
    assert set(every) == set(TRACE_SCHEMA.names) and len(every) == len(TRACE_SCHEMA.names)
    assert ("messages", "trace", *TOKEN_COLUMNS) == CONVERSATION_COLUMNS
    assert (*V2_COLUMNS[len(V1_COLUMNS) :], "token_policy") == TOKEN_COLUMNS
    assert records_to_table([full_record()]).schema.metadata == TRACE_SCHEMA.metadata


def test_every_scalar_column_is_derived_from_the_record() -> None:
    """Each scalar column has a non-null value for a full record: none is left unfilled."""
    [row] = records_to_table([full_record()]).to_pylist()
    filled = SCALAR_COLUMNS + POLICY_COLUMNS + BRANCH_COLUMNS + AGENT_COLUMNS
    assert [name for name in filled if row[name] is None] == []
    assert set(row) == (
        set(SCALAR_COLUMNS)
        | set(CONVERSATION_COLUMNS)
        | set(HISTORY_COLUMNS)
        | set(POLICY_COLUMNS)
        | set(BRANCH_COLUMNS)
        | set(AGENT_COLUMNS)
    )
    assert (row["policy_min"], row["policy_max"]) == (3, 4)  # the first call's runs: 3 then 4


TRACE_FIELDS_ACKNOWLEDGED = {
    "version": "trace blob only",
    "id": "rollout_id",
    "task": "task_type, task_key, task_hash, task_idx (data: trace blob)",
    "agent": "trace blob only",
    "tools": "trace blob only",
    "nodes": "num_turns, messages, token columns",
    "calls": "num_*_tokens",
    "request_rewrites": "trace blob only",
    "response_rewrites": "trace blob only",
    "rewards": "reward, rewards, reward_weights",
    "metrics": "metrics",
    "info": "trace blob only",
    "is_completed": "is_completed",
    "ok": "ok",
    "stop_condition": "stop_condition",
    "errors": "error_type, error_message, num_errors (the stored attempt's), attempts (every attempt's)",
    "timing": "started_at and the *_s span columns",
    "tool_calls": "num_tool_calls",
    "extra_usage": "trace blob only",
    "verifiers": "trace blob only",
    "user_turns": "trace blob only",
    "state": "trace blob only (a task's own shape: no one column type fits every task's)",
}
"""Where each Trace field lands in the table. A new Trace field fails the guard below until
someone decides whether it needs a scalar column (appended to TRACE_SCHEMA) and lists it here."""


def test_every_trace_field_is_acknowledged_by_the_arrow_schema() -> None:
    fields = tuple(f.name for f in msgspec.structs.fields(Trace))
    assert fields == tuple(TRACE_FIELDS_ACKNOWLEDGED)


def test_a_missing_column_is_a_schema_mismatch() -> None:
    table = records_to_table([full_record()]).drop_columns(["reward"])
    pattern = r"^trace table has no column 'reward' \(expected double\)$"
    with pytest.raises(SchemaMismatch, match=pattern) as err:
        check_schema(table)
    assert (err.value.column, err.value.expected, err.value.found) == (
        "reward",
        "double",
        "missing",
    )
    check_schema(table, columns=["run_id", "trace"])  # a selection without it is fine


def test_a_mistyped_column_is_a_schema_mismatch() -> None:
    table = records_to_table([full_record()])
    index = table.schema.get_field_index("num_turns")
    table = table.set_column(index, pa.field("num_turns", pa.string()), pa.array(["3"]))
    pattern = r"^column 'num_turns' has type string, expected int64$"
    with pytest.raises(SchemaMismatch, match=pattern):
        check_schema(table.schema)


def test_a_newer_schema_version_is_refused() -> None:
    table = records_to_table([full_record()])
    newer = table.replace_schema_metadata({b"rollout_ray.schema_version": b"7"})
    with pytest.raises(
        SchemaMismatch,
        match=r"^trace table has schema version 7, newer than version 6 known here; "
        r"upgrade rollout_ray to read it$",
    ):
        check_schema(newer)
    with pytest.raises(SchemaMismatch, match=r"^trace table has schema version 7"):
        table_to_traces(newer)
    check_schema(table.replace_schema_metadata({b"rollout_ray.schema_version": b"1"}))


def test_warm_arrow_does_pyarrows_lazy_pandas_import_in_a_thread_once() -> None:
    """In a fresh process: the import that pyarrow's first conversion would do lands in the
    warming thread, and a second call starts no other thread."""
    import subprocess
    import sys

    pytest.importorskip("pandas")
    probe = (
        "import sys, threading\n"
        "import rollout_ray._record.arrow as arrow\n"
        "assert 'pandas' not in sys.modules\n"
        "arrow.warm_arrow(); first = arrow._warming; arrow.warm_arrow()\n"
        "assert arrow._warming is first and first.name == 'rollout-ray-warm-arrow'\n"
        "first.join(30)\n"
        "print('pandas' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"
