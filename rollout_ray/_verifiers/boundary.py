"""v1 ``@stop`` and ``@intercept`` hooks at our model boundary: routed by their annotations as
upstream routes them (one ``Request`` or ``Response`` parameter, or for stops the ``Trace``
alone), called by ours with what they annotate in upstream's types (our trace reads as
upstream's; a request or response is converted to upstream's model, and an interceptor's
replacement back to ours)."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import msgspec
from pydantic import BaseModel

from .._record.messages import Request, Response
from .._record.trace import Trace
from .v1_state import with_typed_state

Routing = dict[str, str]
"""A v1 stop's parameters by what they take: ``"Trace"``, ``"Request"`` or ``"Response"``."""


def routing(fn: Callable[..., Any]) -> Routing:
    """What each parameter of a v1 ``@stop`` takes, read from its annotations here (where the
    task is made: a Ray worker that gets the user's module by value cannot resolve them)."""
    from verifiers.v1 import types
    from verifiers.v1.trace import Trace as UpstreamTrace

    kinds = {UpstreamTrace: "Trace", types.Request: "Request", types.Response: "Response"}
    hints = typing.get_type_hints(fn)
    out = {}
    for name in inspect.signature(fn).parameters:
        hint = hints.get(name)
        kind = kinds.get(typing.get_origin(hint) or hint)
        if kind is not None:
            out[name] = kind
    return out


def as_our_hook(
    fn: Callable[..., Any], params: Routing, *, intercept: bool = False, state: type[BaseModel] | None = None
) -> Callable[..., Any]:
    """``fn`` with our boundary's parameters: ``value`` (our ``Request`` or ``Response``) when
    it takes one, and ``trace`` (its ``state`` typed as ``state``: ``v1_state.py``); each converted
    to what ``fn`` annotated. An interceptor's replacement comes back as ours (``None``, or the
    same value, changes nothing)."""
    side = next((k for k in params.values() if k != "Trace"), None)

    async def stop(**given: Any) -> Any:
        args = {name: _upstream(kind, given["value"]) for name, kind in params.items() if kind != "Trace"}

        def call(trace: Any) -> Any:
            return fn(**args, **{name: trace for name, kind in params.items() if kind == "Trace"})

        result = await with_typed_state(given["trace"], state, call) if "trace" in given else call(None)
        if inspect.isawaitable(result):
            result = await result
        if not intercept or result is None:
            return result
        return _ours(given["value"], result, unchanged=args[next(n for n, k in params.items() if k != "Trace")])

    # Real classes, not strings: pickled by value to a Ray worker, a closure carries only the
    # globals its code reads, and our routing resolves these annotations there.
    annotations: dict[str, Any] = {"trace": Trace}
    if side is not None:
        annotations = {
            "value": Request if side == "Request" else Response,
            **({"trace": Trace} if "Trace" in params.values() else {}),
        }
    stop.__annotations__ = {**annotations, "return": Any}
    stop.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=t) for n, t in annotations.items()]
    )
    stop.__name__ = fn.__name__
    return stop


def _ours(value: Request | Response, result: Any, unchanged: Any) -> Request | Response | None:
    """An interceptor's replacement as ours: a request whole, a response's message (the only
    part an interceptor may replace, as upstream)."""
    if result == unchanged:
        return None
    if isinstance(value, Request):
        return msgspec.convert(result.model_dump(mode="json", exclude_none=True), Request)
    message = msgspec.convert(result.message.model_dump(mode="json", exclude_none=True), type(value.message))
    return msgspec.structs.replace(value, message=message)


def _upstream(kind: str, value: Request | Response) -> Any:
    from verifiers.v1 import types

    raw = msgspec.to_builtins(value)
    if kind == "Request":
        return types.Request.model_validate(raw)
    assert isinstance(value, Response)
    return types.Response(
        id="",
        created=0,
        model=value.model or "",
        message=raw["message"],
        finish_reason=value.finish_reason,
        usage=raw.get("usage"),
    )
