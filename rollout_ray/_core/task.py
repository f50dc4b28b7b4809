"""Tasks: one row of data (``TaskData``) plus the behaviour that sets it up and scores it.

A ``Task`` never owns a runtime. Its decorated methods (``@reward``, ``@metric``, ``@stop``,
``@intercept``) are discovered by the rollout; ``TaskConfig`` may plug in further stops,
metrics, rewards and judges without subclassing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .._errors import TaskError, boundary
from .._record.trace import Trace, TraceTask
from .hooks import Hook, HookKind, discover, requires, sort_hooks
from .limits import RolloutTimeouts, TaskResources
from .scoring import run_metrics, run_rewards, seed

log = logging.getLogger("rollout_ray")


class TaskData(BaseModel):
    """One task row. Subclass it to add task fields (an answer, a repository, ...).

    ``prompt`` is a string, a list of OpenAI-style message dicts, or ``None`` when a user
    opens the conversation (an interaction). A key that is not a field is refused, never
    dropped (upstream's ``TaskData`` ignores it, and the reward reading it then fails on every
    rollout): declare it on a subclass.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    idx: int = 0
    """Position of the row in its taskset."""
    name: str | None = None
    """Optional human-readable name."""
    prompt: str | list[dict[str, Any]] | None = None
    """The opening user turn(s); ``None`` means a user opens the exchange. Never empty: an
    empty user turn on purpose is ``[{"role": "user", "content": ""}]``."""
    system_prompt: str | None = None
    """System prompt given to the harness."""
    timeout: RolloutTimeouts | None = None
    """Per-task phase timeouts, used where the rollout sets none (B43)."""
    network_allow: list[str] | None = None
    """Hosts the agent may reach besides the framework routes; ``None`` asks for no policy
    (upstream's ``["*"]``), ``[]`` for the framework routes only. Enforced only by a runtime
    whose ``enforces`` holds ``"network"``; others log a warning (B6)."""
    network_block: list[str] | None = None
    """Hosts the agent must not reach; ``None`` blocks nothing."""
    image: str | None = None
    """The image the task's programs run over, read-only under a private writable layer: an
    OCI image layout, a ``docker save`` archive or a rootfs tarball (an absolute path on the
    node that runs the rollout), or an image name in that node's podman or docker store.
    Needs a sandbox runtime (any other fails the rollout with ``SandboxError``); ``None``: the
    host's system."""
    runtime: str | None = None
    """The runtime kind (a provider's name: ``local``, ``sandbox``, ``podman``, ...) this
    task's rollouts run in; ``None``: the run's (``EvalConfig.runtime``, else the executor's
    ``--runtime``). One run may mix kinds; ``rollout-ray eval`` refuses, before anything runs,
    a kind this machine (or a node of the cluster: said in one line) cannot run."""
    resources: TaskResources | None = None
    """What the task's runtime may use (cores, memory in GB): held by a runtime whose
    ``enforces`` holds ``"cpu"`` / ``"memory"``; ``None``: the runtime's defaults."""

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, prompt: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        # An empty prompt reaches the model as an empty message, which is never what a row meant.
        if prompt is not None and not (prompt.strip() if isinstance(prompt, str) else prompt):
            raise ValueError(
                "the prompt is empty; give the opening user turn, or prompt=None when a user opens the conversation"
            )
        return prompt

    @property
    def network_policy(self) -> bool:
        """True when the row asks to restrict the agent's network."""
        return self.network_allow not in (None, ["*"]) or bool(self.network_block)


class PluggedReward(BaseModel):
    """A reward plugged from config: a new function, or a new weight for a decorated one."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    fn: Callable[..., Any] | None = None
    """The scorer; ``None`` keeps the decorated method's body."""
    weight: float | None = None
    """The weight; ``None`` keeps the decorated method's weight, else 1.0."""


class Judge:
    """A grader plugged from config; it records one reward under ``reward_name``.

    Subclass and implement ``score``. Judges run after the task's own rewards.
    """

    def __init__(self, name: str | None = None, weight: float = 1.0) -> None:
        self.name = name
        self.weight = float(weight)

    @property
    def reward_name(self) -> str:
        """``name``, else the class name in snake case without the ``Judge`` suffix."""
        if self.name:
            return self.name
        base = type(self).__name__.removesuffix("Judge") or type(self).__name__
        return re.sub(r"(?<!^)(?=[A-Z])", "_", base).lower()

    async def score(self, task: TaskData, trace: Trace) -> float:
        raise NotImplementedError(f"{type(self).__name__}.score is not implemented")


class TaskConfig(BaseModel):
    """Hooks plugged into a task without subclassing it."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    stops: dict[str, Callable[..., Any]] = Field(default_factory=dict)
    """Extra ``@stop`` hooks by name; one named like a decorated stop replaces it."""
    metrics: dict[str, Callable[..., Any]] = Field(default_factory=dict)
    """Extra metrics by name; one named like a decorated metric replaces it."""
    rewards: dict[str, PluggedReward] = Field(default_factory=dict)
    """Extra or re-weighted rewards by name."""
    judges: list[Judge] = Field(default_factory=list)
    """Graders run after the rewards, each recording the reward ``judge.reward_name``."""


class Task:
    """The behaviour paired with one ``TaskData``: setup, finalize, hooks and scoring."""

    data_type: ClassVar[type[TaskData]] = TaskData
    setup_shareable: ClassVar[bool] = False
    """``setup`` does not depend on the sample (no randomness, nothing of the trace): the samples
    of a group on one machine then run it once, and the others start from a snapshot of what it
    wrote (``Runtime.claim_setup``; image sandboxes share it, other runtimes run it per sample)."""
    state_type: ClassVar[type[BaseModel] | None] = None
    """The pydantic model of the rollout's ``trace.state`` (upstream's ``State``): a rollout
    starts from its defaults and every write over ``/state`` is validated into it; ``None``:
    any JSON object, starting empty (``_core/state``)."""

    def __init__(self, data: TaskData | Mapping[str, Any], config: TaskConfig | None = None):
        if isinstance(data, Mapping):
            self._refuse_unknown_keys(data)
        self.data: TaskData = data if isinstance(data, self.data_type) else self.data_type.model_validate(data)
        self.config = config or TaskConfig()
        self._check_config()

    @classmethod
    def _refuse_unknown_keys(cls, data: Mapping[str, Any]) -> None:
        # One line naming the key and what to declare, where pydantic's error would only say
        # "Extra inputs are not permitted" under the key.
        unknown = [key for key in data if key not in cls.data_type.model_fields]
        if unknown and cls.data_type.model_config.get("extra") != "allow":  # a class that keeps them
            raise ValueError(
                f"{cls.__name__}: task data key {unknown[0]!r} is not a field of "
                f"{cls.data_type.__name__}; declare it on a TaskData subclass "
                f"(class MyData({cls.data_type.__name__}): {unknown[0]}: ...) and set "
                f"{cls.__name__}.data_type = MyData"
            )

    @property
    def hash(self) -> str:
        """sha256 of the row's JSON with sorted keys and ``None`` values dropped.

        Computed once per data object (the driver names the group by it, the rollout records
        it, and a copy sent to an actor carries it): a task's data is not edited in place once
        the task is in use; assign a new ``data`` instead.
        """
        cached = self.__dict__.get("_hash")
        if cached is not None and cached[0] is self.data:
            return cached[1]  # type: ignore[no-any-return]
        row = self.data.model_dump(mode="json", exclude_none=True)
        digest = hashlib.sha256(json.dumps(row, sort_keys=True).encode()).hexdigest()
        self.__dict__["_hash"] = (self.data, digest)
        return digest

    @property
    def key(self) -> str:
        """The stable identity of the task; defaults to ``hash``."""
        return self.hash

    def trace_task(self) -> TraceTask:
        """The task as a trace records it."""
        digest = self.hash
        key = digest if type(self).key is Task.key else self.key  # one hash per rollout, not two
        data_cls = type(self.data)
        return TraceTask(
            type=type(self).__name__,
            key=key,
            hash=digest,
            idx=self.data.idx,
            data=self.data.model_dump(mode="json"),
            data_cls=f"{data_cls.__module__}:{data_cls.__qualname__}",
        )

    @property
    def setup_key(self) -> str | None:
        """What names this task's shareable setup (its class and data); ``None`` unless
        ``setup_shareable``."""
        if not self.setup_shareable:
            return None
        cls = type(self)
        return f"{cls.__module__}.{cls.__qualname__}:{self.hash}"

    def grader_files(self) -> Mapping[str, bytes | str]:
        """Files the grader needs and the agent must never see (tests, a reference solution):
        relative name -> content. They enter the runtime after the agent is gone, before
        ``finalize`` (``Runtime.add_grader_files``), in ``runtime.grader_dir`` (a sandbox's
        ``/.grader``, read-only), where the grader's execs start. None by default."""
        return {}

    async def setup(self, trace: Trace, runtime: Any) -> None:
        """Prepare the runtime for this task (called with the parameters it names)."""

    async def finalize(self, trace: Trace, runtime: Any) -> None:
        """Collect what scoring needs from the runtime, after the agent is done."""

    @classmethod
    def toolsets(cls, config: TaskConfig) -> list[Any]:
        """Per-rollout tool servers (served by the tools layer)."""
        return []

    def user_simulator(self) -> Any:
        """The simulated user who answers the agent (a ``UserSimulator``, fresh for each
        rollout: it may keep state), or ``None`` (the default): the agent runs one segment."""
        return None

    def hooks(self, kind: HookKind) -> list[Hook]:
        """Decorated hooks merged with the config's plugged ones, sorted (-priority, name)."""
        decorated = {h.name: h for h in discover(self, kind)}
        if kind == "stop":
            for name, fn in self.config.stops.items():
                decorated[name] = Hook(name, fn)
        elif kind == "metric":
            for name, fn in self.config.metrics.items():
                decorated[name] = Hook(name, fn)
        elif kind == "reward":
            for name, plug in self.config.rewards.items():
                base = decorated.get(name)
                reward_fn = plug.fn or (base.fn if base else None)
                if reward_fn is None:
                    raise ValueError(
                        f"TaskConfig.rewards[{name!r}] has no fn and the task no @reward {name!r} "
                        "to weigh: give fn=, or name one of the task's rewards"
                    )
                weight = plug.weight if plug.weight is not None else (base.weight if base else 1.0)
                decorated[name] = Hook(
                    name, reward_fn, base.priority if base else 0, weight, base.agent if base else None
                )
        return sort_hooks(list(decorated.values()))

    async def score(self, trace: Trace, runtime: Any = None) -> None:
        """Seed every expected signal, then run metrics, rewards, then judges (B47).

        Without a runtime (offline rescoring), hooks that require a ``runtime`` are skipped.

        Raises:
            TaskError: a scorer failed; seeds it did not fill stay ``None``.
        """
        available: dict[str, Any] = {"task": self.data, "trace": trace}
        if runtime is not None:
            available["runtime"] = runtime
        metrics, rewards = self.hooks("metric"), self.hooks("reward")
        if runtime is None:
            metrics, rewards = _runnable(metrics), _runnable(rewards)
        judges = self.config.judges
        if runtime is None:
            judges = [j for j in judges if not requires(j.score, "runtime")]
            for skipped in set(self.config.judges) - set(judges):
                log.info("scoring skipped: judge=%s reason=needs-runtime", skipped.reward_name)
        with boundary(TaskError, f"task {type(self).__name__} scoring"):
            seed(
                trace,
                metrics=[h.name for h in metrics],
                rewards=[h.name for h in rewards] + [j.reward_name for j in judges],
            )
            await run_metrics(trace, metrics, available)
            await run_rewards(trace, rewards, available)
            judge_hooks = [Hook(j.reward_name, j.score, weight=j.weight) for j in judges]
            await run_rewards(trace, judge_hooks, available)

    def _check_config(self) -> None:
        decorated = {h.name for h in discover(self, "reward")}
        for name, plug in self.config.rewards.items():
            if plug.fn is None and name not in decorated:
                raise ValueError(
                    f"no @reward method named {name!r} on {type(self).__name__}; give the plugged reward an fn"
                )
        seen = decorated | set(self.config.rewards)
        for judge in self.config.judges:
            if judge.reward_name in seen:
                raise ValueError(f"duplicate reward key {judge.reward_name!r}: name the judge")
            seen.add(judge.reward_name)


def _runnable(hooks: list[Hook]) -> list[Hook]:
    kept = [h for h in hooks if not requires(h.fn, "runtime")]
    for h in hooks:
        if h not in kept:
            log.info("scoring skipped: hook=%s reason=needs-runtime", h.name)
    return kept
