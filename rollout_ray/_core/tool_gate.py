"""The tool gate (§5.3, upstream's ``POST /tool``): a harness asks before it runs a tool call.

A harness that declares ``supports_tool_interception`` is handed the gate's URL (B16) and
posts ``{"tool_call_id", "name", "arguments"}`` before executing each tool call the model
made. The task's request ``@intercept``s and ``@stop``s judge the call as they judge its
result in the next request: over the branch that made it plus an empty tool result for it.
The verdict is upstream's: ``{"action": "allow"}``; ``{"action": "deny", "message": <tool
message>}`` when an interceptor rewrote that result (the harness gives the model this
instead of running the call); ``{"action": "stop", "reason": <stop>}`` when a stop fired or
the rollout has already stopped. A call the model never made (a tool a script runs on its
behalf) is judged as if appended to the last assistant turn, as upstream does.

Upstream judges each call once when the turn is committed and serves the cached verdict;
here it is judged when the gate asks, against the same branch: the hooks see the same
messages, and a harness that never asks pays nothing.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .._errors import HarnessError
from .._record.graph import leaves, path_to
from .._record.messages import AssistantMessage, Message, Request, ToolCall, ToolMessage
from .session import RolloutSession


async def decide_tool(session: RolloutSession, tool_call_id: str, name: str | None, arguments: Any) -> dict[str, Any]:
    """The gate's verdict on one tool call (module docstring).

    Raises:
        HarnessError: the call cannot be placed (no assistant turn, or several that match).
        TaskError: a hook failed or returned something malformed (stashed on the session).
    """
    trace = session.trace
    if trace.stopped:
        return {"action": "stop", "reason": trace.stop_condition}
    branch, call = _place(session, tool_call_id, name, arguments)
    probe = ToolMessage(tool_call_id=call.id, content="", name=call.name)
    request, stopped = await session.rewrite_request(Request([*branch, probe], list(trace.tools) or None))
    if stopped is not None:
        trace.stop(stopped)
        return {"action": "stop", "reason": stopped}
    verdict = request.messages[-1]
    if verdict == probe:
        return {"action": "allow"}
    return {"action": "deny", "message": msgspec.to_builtins(verdict)}


def _place(
    session: RolloutSession, tool_call_id: str, name: str | None, arguments: Any
) -> tuple[list[Message], ToolCall]:
    """The branch ending in the assistant turn that made the call, and the call itself."""
    trace = session.trace
    turns = [leaf for leaf in leaves(trace) if isinstance(trace.nodes[leaf].message, AssistantMessage)]
    proposed = [(leaf, call) for leaf in turns for call in trace.nodes[leaf].message.tool_calls or []]  # type: ignore[union-attr]
    # By id (a gate may wrap the model's id), else by name and arguments (a gate that only
    # knows those), as upstream matches them.
    made = [
        (leaf, call)
        for leaf, call in proposed
        if call.id == tool_call_id or tool_call_id.startswith(f"{call.id}|") or tool_call_id.endswith(f":{call.id}")
    ] or [(leaf, call) for leaf, call in proposed if call.name == name and _same_arguments(call, arguments)]
    if len(made) == 1:
        leaf, call = made[0]
        return [trace.nodes[i].message for i in path_to(trace, leaf)], call
    if made or not name or len(turns) != 1:
        raise HarnessError(
            f"tool gate asked about {tool_call_id!r}, which matches {len(made)} proposed calls; "
            "send the tool_call_id of a call in the last assistant turn, or its name"
        )
    *branch, assistant = [trace.nodes[i].message for i in path_to(trace, turns[0])]
    text = arguments if isinstance(arguments, str) else msgspec.json.encode(arguments or {}).decode()
    call = ToolCall(tool_call_id, name, text)
    assert isinstance(assistant, AssistantMessage)
    extended = msgspec.structs.replace(assistant, tool_calls=[*(assistant.tool_calls or []), call])
    return [*branch, extended], call


def _same_arguments(call: ToolCall, arguments: Any) -> bool:
    """Whether the gate's ``arguments`` (JSON text or decoded) are the call's."""
    try:
        theirs = msgspec.json.decode(arguments) if isinstance(arguments, str) else arguments
        return bool(msgspec.json.decode(call.arguments) == theirs)
    except (msgspec.DecodeError, RecursionError):
        return False
