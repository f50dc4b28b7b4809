"""RolloutSpec: what one rollout is, as a driver hands it to whatever hosts it.

The one record that goes out (a ``Trace`` is the one that comes back): the driver makes it,
the executor carries it (on Ray, shipped to a rollout actor), and the host builds the
``Rollout`` it describes with that host's own services (``rollout_host.build_rollout``). A record:
no behaviour of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._core.harness import Harness
from .._core.limits import RolloutLimits, RolloutTimeouts
from .._core.model import Model
from .._core.runtime import Runtime
from .._core.task import Task


@dataclass
class RolloutSpec:
    """One rollout to run: what, with which model, under which budgets, in which runtime.

    ``runtime`` is a live runtime to borrow (e.g. from a ``RuntimeActor`` pool); ``None``
    makes the rollout own a fresh one on its host.
    """

    task: Task
    harness: Harness
    model: Model
    limits: RolloutLimits = field(default_factory=RolloutLimits)
    timeouts: RolloutTimeouts = field(default_factory=RolloutTimeouts)
    model_name: str | None = None
    sampling: dict[str, Any] | None = None
    has_user: bool = False
    runtime: Runtime | None = None
    runtime_kind: str | None = None
    """The kind of the runtime it owns when its task names none (``EvalConfig.runtime``);
    ``None``: its host's."""
    label: str = ""
    """The driver's name for the sample this rollout runs (``<group id>#<sample>``): what a
    host's ``live`` report calls it, so the driver can tell which of its rollouts is where."""
