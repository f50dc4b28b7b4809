"""``Trace.state`` in the records: it survives the msgpack wire and the run table (the lossless
``trace`` column), and a trace written before the field existed reads with an empty state
(the schema grows by appending, §11 of the conventions); a session served in another process
hands its state back with each delta, replaced whole (``_hosting/trace_sync``)."""

from __future__ import annotations

import msgspec

from rollout_ray import RolloutSession, Trace, TraceTask
from rollout_ray._hosting.trace_sync import Cursor, SessionSpec, apply_delta, delta
from rollout_ray._record.arrow import RolloutRecord, records_to_table, table_to_traces
from rollout_ray._record.trace import decode_trace
from rollout_ray.testing import ScriptedModel


def _trace(state: dict[str, object]) -> Trace:
    return Trace(task=TraceTask(type="t", key="k", data={"prompt": "p"}), state=state)


def test_state_survives_the_wire_and_the_run_table() -> None:
    trace = _trace({"count": 3, "seen": ["a", None], "nested": {"x": 1.5}})
    assert decode_trace(msgspec.msgpack.encode(trace)).state == trace.state
    [back] = table_to_traces(records_to_table([RolloutRecord(trace, "run", "g", 0)]))
    assert back.state == trace.state


def test_a_trace_recorded_without_state_reads_with_an_empty_one() -> None:
    old = msgspec.to_builtins(_trace({}))
    del old["state"]
    assert decode_trace(msgspec.msgpack.encode(old)).state == {}


def test_the_served_copys_state_comes_back_replaced_and_an_older_delta_keeps_the_owners() -> None:
    owner = RolloutSession(_trace({"count": 1}), ScriptedModel(default="ok"))
    served = SessionSpec.of(owner).session(ScriptedModel(default="ok"))
    assert served.trace.state == {"count": 1}  # out at registration
    served.trace.state = {"count": 2}
    change = delta(served, Cursor.of(owner.trace))
    apply_delta(owner, change)
    assert owner.trace.state == {"count": 2}
    change.state = None  # a sender that predates the field
    apply_delta(owner, change)
    assert owner.trace.state == {"count": 2}
