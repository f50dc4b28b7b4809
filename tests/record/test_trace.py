"""The Trace record (§3, B44–B46, B49): lossless wire round trips and derived aggregates."""

from __future__ import annotations

import importlib.metadata
import pathlib
import subprocess
import sys

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_ray import (
    AgentInfo,
    AgentSpan,
    AssistantMessage,
    ErrorRecord,
    ImagePart,
    InfrastructureLost,
    InterceptRecord,
    MessageNode,
    ModelCall,
    ProviderError,
    Reward,
    RolloutError,
    RuntimeInfo,
    SystemMessage,
    TaskError,
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
    VersionInfo,
    decode_trace,
    encode_trace,
)
from rollout_ray._record.messages import ImageURL
from rollout_ray._record.trace import LIMIT_STOPS, UserTurn


def full_trace() -> Trace:
    """A trace where every field of every nested struct is set to a non-default value."""
    user = UserMessage([TextPart("look"), ImagePart(ImageURL("data:image/png;base64,AAAA"))])
    calls = [ToolCall(id="c1", name="grep", arguments='{"q": 1}')]
    asst = AssistantMessage(content=[TextPart("ok ")], reasoning_content="hmm", tool_calls=calls)
    return Trace(
        version=2,
        id="trace-1",
        task=TraceTask(
            "MathTask", key="k", hash="h" * 64, idx=7, data={"prompt": "p", "n": [1, 2.5]}, data_cls="tasks:MathData"
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
            MessageNode(0, user, timestamp=2.0),
            MessageNode(
                1,
                asst,
                sampled=True,
                timestamp=3.0,
                token_ids=[1, 2, 3],
                logprobs=[-0.5, -0.25, 0.0],
                advantages=[0.5, 0.5, 0.5],
                mask=[True, True, False],
                is_content=[False, True, True],
            ),
            MessageNode(
                2,
                ToolMessage(tool_call_id="c1", content="found", name="grep"),
                timestamp=4.0,
                original_chars=9000,
                original_digest=b"\x01" * 16,
            ),
            MessageNode(3, AssistantMessage(content="prompt-supplied"), timestamp=5.0),
        ],
        calls=[
            ModelCall(
                node=2,
                model="m-1",
                sampling={"temperature": 0.7, "max_tokens": 64},
                endpoint="/chat/completions",
                finish_reason="tool_calls",
                usage=Usage(
                    prompt_tokens=10, completion_tokens=4, cached_input_tokens=2, reasoning_tokens=1, cost=0.125
                ),
                time=TimeSpan(10.0, 12.5),
                error=ErrorRecord(type="ProviderError", message="slow", status_code=429, traceback="tb"),
                policy=4,
                prompt_shared=2,
                prompt_ids=[9],
                stored_ids=(1, 3),
                token_policy=[(4, 1), (5, 2)],
                interrupts=1,
                dropped={"logit_bias": "not forwarded"},
                tools_digest="0123456789abcdef",
            )
        ],
        request_rewrites=[InterceptRecord("redact")],
        response_rewrites=[InterceptRecord("censor")],
        rewards={"correct": Reward(score=0.5, weight=2.0), "judge": None},
        metrics={"turns": 1.0, "unscored": None},
        info={"judge": [{"text": "yes", "parsed": True}], "n": 3, "x": None},
        is_completed=True,
        ok=True,
        stop_condition="max_turns",
        errors=[
            ErrorRecord(
                type="TaskError",
                message="bad",
                status_code=502,
                traceback="Traceback...",
                lineage=["TaskError", "RolloutError", "Exception", "BaseException"],
            )
        ],
        timing=Timing(
            start=100.0,
            boot=TimeSpan(100.5, 101.0),
            setup=TimeSpan(101.0, 102.0),
            agent=AgentSpan(102.0, 110.0, model=TimeSplit(3.0), harness=TimeSplit(5.0)),
            finalize=TimeSpan(110.0, 111.0),
            scoring=TimeSpan(111.0, 112.0),
        ),
        tool_calls=[ToolCallRecord("calc", "add", '{"a": 1}', False, error="boom", duration=0.5, arguments_chars=90)],
        extra_usage=[Usage(prompt_tokens=7, completion_tokens=2)],
        verifiers=VersionInfo(version="9.9.9", commit="abc123"),
        user_turns=[UserTurn("customer", "more", done=True, node=1, call=ModelCall(model="judge"), agent_node=2)],
        state={"offset": 1, "sums": [3, 4]},
    )


def _reachable_struct_types(info: object, seen: set[type]) -> set[type]:
    """Every Struct class reachable from a msgspec type description."""
    mi = msgspec.inspect
    if isinstance(info, mi.StructType):
        if info.cls in seen:
            return seen
        seen.add(info.cls)
        for f in info.fields:
            _reachable_struct_types(f.type, seen)
    elif isinstance(info, mi.UnionType):
        for t in info.types:
            _reachable_struct_types(t, seen)
    elif isinstance(info, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
        _reachable_struct_types(info.item_type, seen)
    elif isinstance(info, mi.DictType):
        _reachable_struct_types(info.value_type, seen)
    return seen


def _is_set(value: object, field: msgspec.structs.FieldInfo) -> bool:
    if field.default is not msgspec.NODEFAULT:
        return value != field.default
    if field.default_factory is not msgspec.NODEFAULT:
        return value != field.default_factory()
    return value is not None and value not in ("", [], {})


def _covered(value: object, out: dict[type, set[str]]) -> None:
    """For each Struct type seen, the fields that are non-default in at least one instance."""
    if isinstance(value, msgspec.Struct):
        names = out.setdefault(type(value), set())
        for f in msgspec.structs.fields(type(value)):
            v = getattr(value, f.name)
            if _is_set(v, f):
                names.add(f.name)
            _covered(v, out)
    elif isinstance(value, list | dict):
        for v in value.values() if isinstance(value, dict) else value:
            _covered(v, out)


def test_s3_sample_sets_every_field_of_every_struct():
    """Guard: a new field or nested struct type added to Trace must be added to full_trace()."""
    covered: dict[type, set[str]] = {}
    _covered(full_trace(), covered)
    reachable = _reachable_struct_types(msgspec.inspect.type_info(Trace), set())
    assert set(covered) == reachable
    for cls in reachable:
        assert covered[cls] == {f.name for f in msgspec.structs.fields(cls)}, cls.__name__


def test_s3_msgpack_and_json_round_trips_are_lossless():
    trace = full_trace()
    decoded = decode_trace(encode_trace(trace))
    assert decoded == trace and decoded is not trace
    assert [type(n.message) for n in decoded.nodes] == [type(n.message) for n in trace.nodes]
    assert decoded.rewards["judge"] is None and decoded.metrics["unscored"] is None
    assert msgspec.json.decode(msgspec.json.encode(trace), type=Trace) == trace  # JSON too


def test_b49_derived_values_are_not_serialised():
    trace = full_trace()
    field_names = [f.name for f in msgspec.structs.fields(Trace)]
    assert list(msgspec.to_builtins(trace)) == field_names
    assert list(msgspec.msgpack.decode(encode_trace(trace))) == field_names
    for derived in ("reward", "num_turns", "num_input_tokens", "usage", "is_truncated"):
        assert derived not in field_names


def test_s3_num_turns_counts_only_sampled_nodes():
    trace = full_trace()  # one sampled assistant, one prompt-supplied assistant
    assert trace.num_turns == 1
    assert trace.assistant_messages == [trace.nodes[2].message]
    assert trace.tool_messages == [trace.nodes[3].message]


def _node(parent: int | None, sampled: bool = False) -> MessageNode:
    msg = AssistantMessage(content=f"a{parent}") if sampled else UserMessage(f"u{parent}")
    return MessageNode(parent, msg, sampled=sampled)


def _call(
    node: int | None, prompt: int, completion: int, cached: int | None = None, cost: float | None = None
) -> ModelCall:
    return ModelCall(node=node, usage=Usage(prompt, completion, cached_input_tokens=cached, cost=cost))


def test_s3_token_aggregates_on_a_linear_chat():
    trace = Trace(task=TraceTask(type="T"))
    trace.nodes = [_node(None), _node(0, True), _node(1), _node(2, True)]
    trace.calls = [
        _call(1, 10, 3, cached=5),  # input 15, total 18
        ModelCall(node=None, usage=Usage(100, 100)),  # errored: in usage, not in the caps
        ModelCall(node=3, usage=None),  # no usage: skipped
        _call(3, 20, 4),  # input 20 → contributes 20 - 18 = 2, total 24
    ]
    assert (trace.num_turns, trace.num_branches) == (2, 1)
    assert (trace.num_input_tokens, trace.num_output_tokens, trace.num_total_tokens) == (17, 7, 24)
    assert trace.usage == Usage(130, 107, cached_input_tokens=5, reasoning_tokens=None, cost=None)


def test_s3_token_aggregates_on_two_branches():
    """Q18: input dedups by call; output counts the shared call once per branch."""
    trace = Trace(task=TraceTask(type="T"))
    # 0 ← 1* ← 2 ← 3*   and the fork   1* ← 4 ← 5*
    trace.nodes = [_node(None), _node(0, True), _node(1), _node(2, True), _node(1), _node(4, True)]
    c1, c2, c3 = _call(1, 10, 5, cost=0.5), _call(3, 25, 7), _call(5, 12, 6, cached=8, cost=0.25)
    trace.calls = [c3, c2, c1]  # stored order does not matter: calls follow the path
    branches = trace.branches
    assert [(b.nodes, b.calls) for b in branches] == [((0, 1, 2, 3), (c1, c2)), ((0, 1, 4, 5), (c1, c3))]
    assert trace.messages == [trace.nodes[i].message for i in (0, 1, 4, 5)]
    assert trace.num_turns == 3
    assert (trace.num_input_tokens, trace.num_output_tokens, trace.num_total_tokens) == (
        10 + (25 - 15) + (20 - 15),
        (5 + 7) + (5 + 6),
        32 + 26,
    )
    assert trace.usage == Usage(47, 18, cached_input_tokens=8, reasoning_tokens=None, cost=0.75)


def _by_branches(trace: Trace) -> tuple[int, int, int]:
    """The §3 definitions, read literally off ``trace.branches``."""
    seen: set[int] = set()
    input_tokens = 0
    for branch in trace.branches:
        previous = 0
        for call in branch.calls:
            if call.usage is None:
                continue
            if id(call) not in seen:
                seen.add(id(call))
                input_tokens += max(0, call.usage.input_tokens - previous)
            previous = call.usage.total_tokens
    output = sum(c.usage.completion_tokens for b in trace.branches for c in b.calls if c.usage)
    total = sum(
        ([c for c in b.calls if c.usage] or [ModelCall(usage=Usage())])[-1].usage.total_tokens  # type: ignore[union-attr]
        for b in trace.branches
    )
    return input_tokens, output, total


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_s3_one_pass_counts_equal_the_branch_definitions(data: st.DataObject) -> None:
    size = data.draw(st.integers(0, 12))
    trace = Trace(task=TraceTask(type="T"))
    trace.nodes = [
        _node(data.draw(st.none() | st.integers(0, i - 1)) if i else None, data.draw(st.booleans()))
        for i in range(size)
    ]
    calls = data.draw(
        st.lists(
            st.tuples(
                st.none() | st.integers(0, max(0, size - 1)), st.integers(0, 50), st.integers(0, 20), st.booleans()
            ),
            max_size=10,
        )
    )
    trace.calls = [ModelCall(node=n if size else None, usage=Usage(p, c) if has else None) for n, p, c, has in calls]
    counts = trace.counts()
    assert (counts.num_input_tokens, counts.num_output_tokens, counts.num_total_tokens) == _by_branches(trace)
    assert counts.num_turns == trace.num_turns == sum(n.sampled for n in trace.nodes)


def test_b49_reward_sums_score_times_weight_skipping_none():
    trace = Trace(task=TraceTask(type="T"))
    assert trace.reward == 0
    trace.rewards = {"a": Reward(0.5, 2.0), "b": None, "c": Reward(0.25), "d": Reward(1.0, 0.0)}
    assert trace.reward == 1.25
    trace.record_reward("e", 1, weight=3)
    assert trace.rewards["e"] == Reward(1.0, 3.0) and trace.reward == 4.25


def test_s3_stop_first_condition_wins_and_completes():
    trace = Trace(task=TraceTask(type="T"))
    assert trace.last_error is None
    assert (trace.is_completed, trace.stop_condition, trace.stopped) == (False, None, False)
    trace.stop("max_turns")
    trace.stop("agent_completed")
    assert (trace.is_completed, trace.stop_condition, trace.stopped) == (True, "max_turns", True)


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:  # noqa: BLE001 - returns whatever it raised, as the caller passed it
        return e


def test_s3_record_error_appends_error_with_traceback():
    trace = Trace(task=TraceTask(type="T"), ok=True)
    trace.record_error(_raised(ValueError("boom")))
    [err] = trace.errors
    assert (err.type, err.message, err.status_code) == ("ValueError", "boom", None)
    assert err.traceback.startswith("Traceback (most recent call last):\n")
    assert err.traceback.endswith("ValueError: boom\n")
    assert (trace.ok, trace.stop_condition, trace.is_completed) == (False, "error", True)
    assert trace.last_error is err


def test_s3_provider_error_has_no_traceback_and_keeps_status():
    trace = Trace(task=TraceTask(type="T"))
    trace.record_error(_raised(ProviderError("overloaded", 429)))
    assert trace.errors == [
        ErrorRecord(
            "ProviderError",
            "overloaded",
            status_code=429,
            traceback=None,
            lineage=["ProviderError", "RolloutError", "Exception", "BaseException"],
        )
    ]


class _TasksetProviderError(ProviderError):
    """A taskset's own kind of provider failure."""


def test_is_a_reads_the_recorded_lineage() -> None:
    record = ErrorRecord.from_exception(_raised(_TasksetProviderError("quota", 429)))
    assert record.lineage == ["_TasksetProviderError", "ProviderError", "RolloutError", "Exception", "BaseException"]
    assert record.is_a(ProviderError) and record.is_a(RolloutError) and record.is_a((InfrastructureLost, ProviderError))
    assert not record.is_a(InfrastructureLost) and not record.is_a(TaskError)
    lost = ErrorRecord.from_exception(_raised(InfrastructureLost("gone")))
    assert lost.is_a(InfrastructureLost) and not lost.is_a(RolloutError)


def test_is_a_holds_in_a_process_that_never_imported_the_raising_class(tmp_path: pathlib.Path) -> None:
    """The lineage travels with the record: a driver that decodes a taskset's error without
    the taskset still knows it was a provider failure."""
    (tmp_path / "my_taskset.py").write_text(
        "from rollout_ray import ProviderError\n\nclass QuotaExceeded(ProviderError):\n    pass\n"
    )
    write = (
        "import sys; sys.path.insert(0, sys.argv[1]); import my_taskset\n"
        "from rollout_ray import Trace, TraceTask, encode_trace\n"
        "t = Trace(task=TraceTask(type='T')); t.record_error(my_taskset.QuotaExceeded('over quota', 429))\n"
        "sys.stdout.buffer.write(encode_trace(t))\n"
    )
    blob = subprocess.run([sys.executable, "-c", write, str(tmp_path)], capture_output=True, check=True).stdout
    read = (
        "import sys; from rollout_ray import ProviderError, TaskError, decode_trace\n"
        "[e] = decode_trace(sys.stdin.buffer.read()).errors\n"
        "print(e.type, e.is_a(ProviderError), e.is_a(TaskError), 'my_taskset' in sys.modules)\n"
    )
    answer = subprocess.run([sys.executable, "-c", read], input=blob, capture_output=True, check=True).stdout
    assert answer.decode().split() == ["QuotaExceeded", "True", "False", "False"]


def test_a_record_without_lineage_asks_this_process_for_its_class() -> None:
    """Records written before lineages were kept: the class is looked up by its type name."""
    assert ErrorRecord("OverlongPromptError", "long").is_a(ProviderError)
    assert ErrorRecord("InfrastructureLost", "gone").is_a(InfrastructureLost)
    assert ErrorRecord("TimeoutError", "slow").is_a(OSError)
    assert not ErrorRecord("NoSuchError", "?").is_a(ProviderError)
    old = msgspec.msgpack.encode({"type": "ProviderError", "message": "x"})  # a row of an older run
    assert msgspec.msgpack.decode(old, type=ErrorRecord).is_a(RolloutError)


def test_q3_record_error_keeps_an_earlier_stop():
    trace = Trace(task=TraceTask(type="T"), ok=True)
    trace.stop("max_turns")
    first = _raised(RuntimeError("finalize broke"))
    trace.record_error(first)
    trace.record_error(_raised(KeyError("k")))
    assert (trace.ok, trace.stop_condition) == (False, "max_turns")
    assert [e.type for e in trace.errors] == ["RuntimeError", "KeyError"]
    assert trace.last_error.message == "'k'"


def _timed_trace(agent: AgentSpan, *durations: float) -> Trace:
    calls = [ModelCall(time=TimeSpan(50.0, 50.0 + d)) for d in durations]
    calls.append(ModelCall(error=ErrorRecord("ProviderError", "x"), time=TimeSpan(60.0, 61.0)))
    return Trace(task=TraceTask(type="T"), calls=calls, timing=Timing(agent=agent))


@pytest.mark.parametrize(("end", "model", "harness"), [(110.0, 5.5, 4.5), (104.0, 4.0, 0.0)])
def test_b46_split_agent_time_sums_all_calls_and_clamps_to_the_agent_span(end, model, harness):
    """Failed calls count too; model time never exceeds the agent span."""
    trace = _timed_trace(AgentSpan(100.0, end), 3.0, 1.5)  # + a failed 1.0 s call
    trace.split_agent_time()
    assert (trace.timing.agent.model, trace.timing.agent.harness) == (TimeSplit(model), TimeSplit(harness))


def test_b46_split_agent_time_does_nothing_without_agent_end():
    trace = _timed_trace(AgentSpan(100.0, 0.0, model=TimeSplit(9.0), harness=TimeSplit(8.0)), 3.0)
    trace.split_agent_time()
    assert (trace.timing.agent.model, trace.timing.agent.harness) == (TimeSplit(9.0), TimeSplit(8.0))


@pytest.mark.parametrize(
    ("span", "duration"),
    [
        (TimeSpan(), 0.0),
        (TimeSpan(5.0), 0.0),
        (TimeSpan(5.0, 3.0), 0.0),
        (TimeSpan(5.0, 7.5), 2.5),
        (AgentSpan(5.0), 0.0),
        (AgentSpan(5.0, 9.0), 4.0),
    ],
)
def test_b46_timespan_duration(span, duration):
    """B45/B46: a span never ended (or never started) has duration 0."""
    assert span.duration == duration


@pytest.mark.parametrize("condition", sorted(LIMIT_STOPS))
def test_s3_is_truncated_on_limit_stops(condition):
    trace = Trace(task=TraceTask(type="T"))
    assert not trace.is_truncated
    trace.stop(condition)
    assert trace.is_truncated


def test_s3_is_truncated_reads_the_last_error_free_call():
    trace = Trace(task=TraceTask(type="T"), stop_condition="agent_completed")
    trace.calls = [ModelCall(finish_reason="length"), ModelCall(finish_reason="stop", error=ErrorRecord("E", "x"))]
    assert trace.is_truncated
    trace.calls.append(ModelCall(finish_reason="stop"))
    assert not trace.is_truncated
    trace.calls.append(ModelCall(finish_reason="tool_calls"))
    assert not trace.is_truncated


def test_s3_last_reply_is_the_stripped_last_sampled_assistant():
    trace = Trace(task=TraceTask(type="T"))
    assert trace.last_reply == ""
    trace.nodes = [
        MessageNode(None, UserMessage("q")),
        MessageNode(
            0, AssistantMessage([TextPart("  the "), ImagePart(ImageURL("u")), TextPart("answer\n")]), sampled=True
        ),
        MessageNode(1, AssistantMessage("prompt-supplied, not sampled")),
    ]
    assert trace.last_reply == "the answer"
    trace.nodes.append(MessageNode(2, AssistantMessage(None, tool_calls=[ToolCall("c", "f")]), sampled=True))
    assert trace.last_reply == ""


def test_a_trace_written_with_extra_usage_or_without_it_reads() -> None:
    """``extra_usage`` was dropped for a while and is back (judges fill it): traces stored in
    either form decode, and one stored before ``verifiers`` existed gets this build's."""
    for old in (
        {"task": {"type": "T"}, "extra_usage": [{"prompt_tokens": 3}], "ok": True},
        {"task": {"type": "T"}, "ok": True},
    ):
        trace = decode_trace(msgspec.msgpack.encode(old))
        assert trace.ok and trace.extra_usage == [Usage(prompt_tokens=3)] * len(old.get("extra_usage", []))
        assert trace.verifiers == VersionInfo(version=importlib.metadata.version("rollout_ray"))
