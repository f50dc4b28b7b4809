"""One verifiers v1 ``Task`` as ours: its row as our ``TaskData`` (the v1 fields we share
mapped, its own fields kept), its ``@reward`` / ``@metric`` hooks scored by our rollout with
the v1 row as ``task``, as upstream's ``Task.score`` calls them, its toolsets as ours
(``v1_toolset.py``)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

from .._core.hooks import Hook, HookKind
from .._core.task import Task, TaskData
from .boundary import as_our_hook, routing
from .v1_runtime import v1_runtime
from .v1_state import state_type, with_typed_state
from .v1_toolset import refusal as toolset_refusal
from .v1_toolset import toolset_class

# Upstream TaskData fields whose default means "nothing asked": a row that sets one asks for
# a feature this adapter does not map yet, and is refused rather than run without it.
_UNMAPPED_DEFAULTS: dict[str, Any] = {"workdir": None, "agent_user": None, "skills": [], "artifacts": []}
# Task methods whose override is not mapped: verifier staging after artifacts are restored
# (no artifacts here).
_RUNTIME_METHODS = ("stage_verifier",)


class V1Data(TaskData):
    """A v1 row: the fields we share are ours; the row's own (``answer``, ...) are kept, as
    upstream's ``WireTaskData`` keeps them."""

    model_config = ConfigDict(frozen=True, extra="allow")


class V1Task(Task):
    """A v1 task run by our rollout; ``upstream`` is the v1 task itself (its hooks' owner)."""

    data_type = V1Data

    def __init__(self, upstream: Any) -> None:
        refuse_unmapped(upstream)
        self.upstream = upstream
        # Routed here, where the task was made: a worker that gets the user's module by value
        # cannot resolve its annotations (the names they use, such as ``vf``, stay behind).
        self.routing = {
            (kind, fn.__name__): routing(fn) for kind in ("stop", "intercept") for fn in _boundary_hooks(upstream, kind)
        }
        # Loaded here too (by plugin id, as upstream's Task.score loads them): an unknown id
        # fails the task's construction, before anything runs.
        self.judges = upstream.plugged_judges()
        super().__init__(_row(upstream.data))

    @property
    def key(self) -> str:
        return str(self.upstream.key)

    async def setup(self, trace: Any, runtime: Any) -> None:
        """The v1 task's ``setup`` with our trace (it reads as upstream's) and our runtime
        with upstream's calls (``v1_runtime.py``)."""
        await with_typed_state(trace, self.state_type, lambda t: self.upstream.setup(t, v1_runtime(runtime)))

    async def finalize(self, trace: Any, runtime: Any) -> None:
        await with_typed_state(trace, self.state_type, lambda t: self.upstream.finalize(t, v1_runtime(runtime)))

    def toolsets(self, config: Any) -> list[Any]:  # type: ignore[override]
        """The v1 task's toolsets as ours, one set per rollout; made from the v1 task's own
        config (upstream's ``toolsets`` reads it), not ours."""
        return [toolset_class(type(t))(t) for t in type(self.upstream).toolsets(self.upstream.config)]  # type: ignore[call-arg,arg-type]

    def hooks(self, kind: HookKind) -> list[Hook]:
        if kind in ("stop", "intercept"):
            return [
                Hook(
                    fn.__name__,
                    as_our_hook(
                        fn, self.routing[kind, fn.__name__], intercept=kind == "intercept", state=self.state_type
                    ),
                    getattr(fn, f"{kind}_priority", 0),
                )
                for fn in _boundary_hooks(self.upstream, kind)
            ]
        hooks = [
            Hook(
                fn.__name__,
                _with_v1_row(fn, self.upstream.data, self.state_type),
                getattr(fn, f"{kind}_priority", 0),
                float(getattr(fn, "_vf_weight", 1.0)),
            )
            for fn in self.upstream.hooks(kind)
        ]
        if kind == "reward":  # plugged judges score as rewards after the task's own, as upstream's
            hooks += [
                Hook(
                    j.reward_name,
                    _with_v1_row(j.score, self.upstream.data, self.state_type),
                    -1 << 30,
                    float(j.config.weight),
                )
                for j in self.judges
            ]
        return hooks


@functools.cache
def adapter_class(upstream_cls: type) -> type[V1Task]:
    """The ``V1Task`` subclass for one v1 task class: named as it (the trace's ``task.type``
    is upstream's) and placed in its module, so an executor that ships a taskset's module to
    workers that cannot import it (Ray, for a ``.py`` file) ships this one too."""
    return type(
        upstream_cls.__name__,
        (V1Task,),
        {
            "__module__": upstream_cls.__module__,
            "__qualname__": f"{upstream_cls.__qualname__}.rollout_ray",
            "state_type": state_type(upstream_cls),
        },
    )


def refuse_unmapped(upstream: Any) -> None:
    """Raise ``ValueError`` in one line naming the first v1 feature of ``upstream`` that is
    not mapped onto ours yet."""
    from verifiers.v1.session import hook_boundary
    from verifiers.v1.task import Task as UpstreamTask

    cls, name = type(upstream), type(upstream).__name__
    reasons = [
        f"it overrides {m}() (no artifacts are restored here)"
        for m in _RUNTIME_METHODS
        if getattr(cls, m) is not getattr(UpstreamTask, m)
    ]
    for kind in ("stop", "intercept"):
        for fn in _boundary_hooks(upstream, kind):  # a wrong shape: upstream's TypeError, naming the hook
            hook_boundary(fn, allow_trace=kind == "stop")
    reasons += [r for r in map(toolset_refusal, cls.toolsets(upstream.config)) if r]
    reasons += ["it needs a container (NEEDS_CONTAINER)"] if cls.NEEDS_CONTAINER else []
    reasons += [
        f"its row sets {f}"
        for f, default in _UNMAPPED_DEFAULTS.items()
        if getattr(upstream.data, f, default) != default
    ]
    unmapped = sorted(set(upstream.data.resources.model_dump(exclude_none=True)) - {"cpu", "memory"})
    reasons += [f"its row asks for {' and '.join(unmapped)} ({upstream.data.resources})"] if unmapped else []
    if reasons:
        raise ValueError(f"verifiers task {name}: not mapped onto rollout_ray yet: {reasons[0]}")


def _boundary_hooks(upstream: Any, kind: str) -> list[Callable[..., Any]]:
    """A v1 task's stops (decorated and plugged) or interceptors, in upstream's order."""
    from verifiers.v1.utils.decorators import discover_decorated

    return upstream.hooks("stop") if kind == "stop" else discover_decorated(upstream, "intercept")  # type: ignore[no-any-return]


def _row(data: Any) -> dict[str, Any]:
    """The v1 row as our ``TaskData`` fields plus its own."""
    shared = {"idx", "name", "system_prompt", "image", "prompt", "timeout", "network_allow", "network_block"}
    row: dict[str, Any] = {
        k: v
        for k, v in data.model_dump(mode="json").items()
        if k not in shared and k not in _UNMAPPED_DEFAULTS and k not in ("resources", "artifact_max_bytes")
    }
    row.update(idx=data.idx or 0, name=data.name, system_prompt=data.system_prompt, image=data.image)
    prompt = data.prompt
    row["prompt"] = (
        prompt
        if prompt is None or isinstance(prompt, str)
        else [m.model_dump(mode="json", exclude_none=True) for m in prompt]
    )
    timeout = data.timeout.model_dump(exclude_none=True)
    row["timeout"] = timeout or None
    row["network_allow"] = None if data.network_allow == ["*"] else list(data.network_allow)
    row["network_block"] = list(data.network_block) or None
    row["resources"] = data.resources.model_dump(include={"cpu", "memory"}, exclude_none=True) or None  # TaskResources
    return row


def _with_v1_row(fn: Callable[..., Any], data: Any, state: type[BaseModel] | None) -> Callable[..., Any]:
    """``fn`` called by our scoring (by parameter name) with the v1 row as ``task``, and the
    trace with its state typed as ``state`` (``v1_state.py``)."""

    async def call(**available: Any) -> Any:
        if "task" in available:
            available["task"] = data
        if "runtime" in available:
            available["runtime"] = v1_runtime(available["runtime"])
        if "trace" not in available:
            result = fn(**available)
            return await result if inspect.isawaitable(result) else result
        return await with_typed_state(available.pop("trace"), state, lambda t: fn(trace=t, **available))

    call.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    call.__name__ = fn.__name__
    return call
