"""Hook decorators and how hooks are found, routed and called.

``@reward`` / ``@metric`` scoring hooks receive their arguments by *parameter name*
(``task``, ``trace``, ``runtime``). ``@stop`` / ``@intercept`` boundary hooks are routed by
*parameter annotation* (B5): one ``Request`` or ``Response`` parameter attaches the hook to
that side of the model call; a ``Trace``-only stop runs before every turn. Interceptors can
never take the Trace alone.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast, overload

from .._record.messages import Request, Response
from .._record.trace import Trace

HookKind = Literal["reward", "metric", "stop", "intercept"]
F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__rollout_ray_hook__"


@dataclass(frozen=True)
class HookSpec:
    """What a decorator attached to a function."""

    kind: HookKind
    priority: int = 0
    weight: float = 1.0
    agent: str | None = None


@dataclass(frozen=True)
class Hook:
    """A discovered hook: its name, the bound callable, priority, and (rewards) weight and
    agent (``None``: the rollout's own agent)."""

    name: str
    fn: Callable[..., Any]
    priority: int = 0
    weight: float = 1.0
    agent: str | None = None


def _decorator(spec: HookSpec) -> Callable[[F], F]:
    def mark(fn: F) -> F:
        setattr(fn, _MARK, spec)
        return fn

    return mark


@overload
def reward(fn: F, /) -> F: ...
@overload
def reward(*, weight: float = 1.0, priority: int = 0, agent: str | None = None) -> Callable[[F], F]: ...
def reward(fn: Any = None, /, *, weight: float = 1.0, priority: int = 0, agent: str | None = None) -> Any:
    """Mark a task method as a reward: its float result, times ``weight``, adds to reward.

    ``agent``: in a multi-agent rollout, the agent it rewards (a ``PeerAgent``'s name); by
    default the rollout's own agent. Each agent's sum is its reward (``agent_rewards``)."""
    mark = _decorator(HookSpec("reward", priority, float(weight), agent))
    return mark(fn) if fn is not None else mark


def _simple(kind: HookKind, doc: str) -> Any:
    def decorator(fn: Any = None, /, *, priority: int = 0) -> Any:
        mark = _decorator(HookSpec(kind, priority))
        return mark(fn) if fn is not None else mark

    decorator.__name__ = kind
    decorator.__doc__ = doc
    return decorator


metric = _simple("metric", "Mark a task or harness method as a metric (a float, or a mapping).")
stop = _simple("stop", "Mark a task method as a stop condition; it must return a bool.")
intercept = _simple("intercept", "Mark a task method as a request or response rewriter.")


def hook_spec(fn: Any) -> HookSpec | None:
    """The decorator spec on ``fn`` (or on the function behind a static/class method)."""
    return getattr(getattr(fn, "__func__", fn), _MARK, None)


def discover(obj: object, kind: HookKind) -> list[Hook]:
    """The ``kind`` hooks of ``obj``, sorted by descending priority then name.

    The most-derived definition of each name decides: an undecorated override hides a
    decorated base method (B50).
    """
    hooks = []
    for attr, spec in _decorated(cast(type, obj.__class__)):  # mypy: type[object] is not Hashable
        if spec.kind == kind:
            fn = getattr(obj, attr)
            # Named like the function, as upstream (a hook made by a factory keeps its name).
            hooks.append(Hook(getattr(fn, "__name__", attr), fn, spec.priority, spec.weight, spec.agent))
    return sort_hooks(hooks)


@functools.cache
def _decorated(cls: type) -> tuple[tuple[str, HookSpec], ...]:
    # Classes are not edited after definition, so discovery is computed once per class.
    found = []
    for name in dir(cls):
        spec = hook_spec(inspect.getattr_static(cls, name))
        if spec is not None:
            found.append((name, spec))
    return tuple(found)


def sort_hooks(hooks: list[Hook]) -> list[Hook]:
    return sorted(hooks, key=lambda h: (-h.priority, h.name))


_BOUNDARY_TYPES: dict[str, type] = {"Request": Request, "Response": Response, "Trace": Trace}


def _parameter_types(fn: Callable[..., Any]) -> dict[str, Any]:
    return _cached(_TYPES, fn, _compute_parameter_types)


def _compute_parameter_types(fn: Callable[..., Any]) -> dict[str, Any]:
    target = inspect.unwrap(getattr(fn, "__func__", fn))
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - get_type_hints raises anything a user's annotation evaluates to
        # Unresolvable forward references: fall back to the raw strings and match by name.
        hints = {k: _BOUNDARY_TYPES.get(v, v) for k, v in inspect.get_annotations(target).items()}
    hints.pop("return", None)
    return {name: typing.get_origin(t) or t for name, t in hints.items()}


def boundary_of(fn: Callable[..., Any], *, allow_trace: bool, name: str | None = None) -> type:
    """The boundary a hook attaches to: ``Request``, ``Response`` or (stops only) ``Trace``.

    Raises:
        TypeError: the hook does not have exactly one Request or Response parameter (and at
            most one Trace), or, for stops, exactly one Trace parameter.
    """
    types = list(_parameter_types(fn).values())
    sides = [t for t in types if t is Request or t is Response]
    traces = sum(1 for t in types if t is Trace)
    if len(sides) == 1 and traces <= 1:
        return sides[0]
    if not sides and allow_trace and traces == 1:
        return Trace
    label = name or getattr(fn, "__qualname__", repr(fn))
    expected = "Request, Response, or Trace" if allow_trace else "Request or Response"
    raise TypeError(f"{label} must have exactly one {expected} parameter")


def call_by_type(fn: Callable[..., Any], values: Mapping[type, Any]) -> Any:
    """Call a boundary hook, passing each annotated parameter the value of its type."""
    kwargs = {p: values[t] for p, t in _parameter_types(fn).items() if t in values}
    return fn(**kwargs)


def requires(fn: Callable[..., Any], name: str) -> bool:
    """True when ``fn`` has a parameter ``name`` without a default."""
    param = _parameters(fn).get(name)
    return param is not None and param.default is inspect.Parameter.empty


async def call_by_name(fn: Callable[..., Any], available: Mapping[str, Any]) -> Any:
    """Call ``fn`` with the ``available`` values its parameters name; await if async."""
    params = _parameters(fn)
    result = fn(**{k: v for k, v in available.items() if k in params})
    if inspect.isawaitable(result):
        result = await result
    return result


# Hooks are called on every rollout, several times; their signatures never change, and
# ``inspect.signature`` / ``get_type_hints`` cost more than the hooks themselves. A bound
# method is keyed by its function (the instance does not change the parameters).
_SIGNATURES: dict[Any, Mapping[str, inspect.Parameter]] = {}
_TYPES: dict[Any, dict[str, Any]] = {}
_CACHE_LIMIT = 4096
T_ = TypeVar("T_")


def _parameters(fn: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    return _cached(_SIGNATURES, fn, lambda f: inspect.signature(f).parameters)


def _cached(cache: dict[Any, T_], fn: Callable[..., Any], compute: Callable[[Callable[..., Any]], T_]) -> T_:
    func = getattr(fn, "__func__", None)
    key = (func, True) if func is not None and getattr(fn, "__self__", None) is not None else (fn, False)
    try:
        return cache[key]
    except KeyError:
        value = compute(fn)
        if len(cache) < _CACHE_LIMIT:
            cache[key] = value
        return value
    except TypeError:  # an unhashable callable
        return compute(fn)


async def resolve(result: Any) -> Any:
    """Await ``result`` when a hook was async."""
    return await result if inspect.isawaitable(result) else result


def classify(task: Any) -> dict[str, list[Hook]]:
    """The task's boundary hooks by where they attach, as ``RolloutSession`` takes them (B4).

    Interceptors are the task's ``hooks("intercept")`` (its decorated ``@intercept`` methods,
    unless a task class supplies them otherwise, as the verifiers adapter does); stops are its
    ``hooks("stop")`` (decorated and plugged).

    Raises:
        TypeError: a hook has the wrong parameter shape (B5).
    """
    sides: dict[str, list[Hook]] = {
        "trace_stops": [], "request_stops": [], "response_stops": [],
        "request_interceptors": [], "response_interceptors": [],
    }  # fmt: skip
    for hook in task.hooks("intercept"):
        side = boundary_of(hook.fn, allow_trace=False, name=hook.name)
        sides["request_interceptors" if side is Request else "response_interceptors"].append(hook)
    for hook in task.hooks("stop"):
        side = boundary_of(hook.fn, allow_trace=True, name=hook.name)
        by_side: dict[type, str] = {Request: "request_stops", Response: "response_stops"}
        key = by_side.get(side, "trace_stops")
        sides[key].append(hook)
    return sides
