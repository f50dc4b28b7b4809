"""What a runtime provider is (``providers.py`` is the registry of them): a name, a factory,
what its kind can do, why a machine cannot run it. Apart from the registry so that a provider's
module imports this, never the registry that imports it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._core.limits import TaskResources
from .._core.runtime import Runtime
from .cgroup import tracking_controller


@dataclass(frozen=True)
class Capabilities:
    """What a kind can do; a caller asks these, never the kind's name."""

    isolation: bool = False
    """Rollouts cannot read each other's processes and files, nor the host's."""
    images: bool = False
    """Runs over ``TaskData.image``."""
    snapshots: bool = False
    """Shares a group's setup by snapshot (``Runtime.claim_setup``); else each sample runs it."""
    grader_files: bool = False
    """``add_grader_files`` puts files where the agent, gone by then, never wrote nor read."""
    warm_pool: bool = False
    """Its host may start runtimes over an image before rollouts ask (``warm_pool.py``)."""
    routes: bool = False
    """A network policy closed until ``prepare_execution`` sets the allowed routes."""


@dataclass(frozen=True)
class HostResources:
    """What a ``RuntimeHost`` hands a provider's factory for each runtime it makes."""

    root: str
    """The host's directory: the runtime's files live under it (its guardian removes them)."""
    env: Mapping[str, str]
    """The runtime's environment; it carries the host's marker (``HOST_MARKER``), by which the
    guardian finds the runtime's processes: a provider whose programs do not inherit it must
    clean up otherwise (see ``podman.py``)."""
    cgroup_parents: Any
    keeper: Any
    start_gates: Sequence[Any]
    host_token: str
    budget: TaskResources | None = None
    """What the task asked its runtime may use (``TaskData.resources``): a provider holds its
    programs to what its ``enforces`` names, and ignores the rest."""


Factory = Callable[[str, "str | None", HostResources], Runtime]
"""``(name, image, resources) -> runtime`` (created, not started)."""


@dataclass(frozen=True)
class Provider:
    name: str
    make: Factory
    capabilities: Capabilities
    unavailable: Callable[[], str | None] = lambda: None
    """Why this machine cannot run the kind, or ``None``."""
    enforces: frozenset[str] = frozenset()
    """``Runtime.enforces`` of its runtimes (a ``RemoteRuntime`` reports it for them)."""
    host_url: Callable[[str], str] = field(default=lambda url: url)
    """How a program in its runtimes names a host URL (a route's URL inside the box)."""
    cgroup_controllers: Callable[[], tuple[str, ...]] | None = None
    """The host's parent cgroups its runtimes go under; ``None``: the tracking controller."""
    release: Callable[[str], Awaitable[object]] | None = None
    """Called with a host's token when the host shuts down: removes what the kind keeps on
    the node for that host's runtimes beyond their own lives (podman: the image tags it loaded)."""
    label: str = ""
    """How ``rollout-ray eval``'s summary names it (default: its name)."""
    help: str = ""
    """What ``rollout-ray eval --help`` says of it."""

    def controllers(self) -> tuple[str | None, ...]:
        """The controllers of the host's parent cgroups its runtimes go under."""
        return self.cgroup_controllers() if self.cgroup_controllers is not None else (tracking_controller(),)

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.name)
