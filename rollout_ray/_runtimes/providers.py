"""Runtime providers: the one seam through which every runtime kind is chosen and made.

A provider is a name (what ``--runtime NAME``, ``EvalConfig``'s executor and
``RuntimeHost(kind=...)`` take), a factory that makes one runtime on a ``RuntimeHost``,
what the kind can do (``Capabilities``) and why this machine cannot run it
(``unavailable``). Everything outside this module asks the provider — never compares a
kind's name (``tests/test_layers.py`` fails on a ``== "sandbox"`` elsewhere), so a new
provider is one module declaring a ``Provider`` plus its import line in ``_load``, or, outside
this package, an entry point in the ``rollout_ray.runtime_providers`` group naming its
``Provider`` (docs/runtime-providers.md says what one must guarantee).

Like verifiers v1 (``verifiers/v1/runtimes/__init__.py``: one config union, one factory),
but a provider here is made by a host that owns cleanup: the host's guardian removes what
its runtimes leave when its process dies, and the host's start gates bound how many start
at once (verifiers' creation limiter).
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from .._core.runtime import Runtime
from .provider import Capabilities, HostResources, Provider

__all__ = [
    "AUTO",
    "AUTO_ORDER",
    "Capabilities",
    "HostResources",
    "Provider",
    "names",
    "provider",
    "register",
    "resolve",
]

ENTRY_POINT_GROUP = "rollout_ray.runtime_providers"
"""Where installed distributions declare providers of their own (each a ``Provider``)."""
AUTO = "auto"
"""Not a provider: the first of ``AUTO_ORDER`` this machine can run."""
AUTO_ORDER = ("sandbox", "local")
"""What ``auto`` tries, in order: the sandbox isolates rollouts from each other and the
host (their proxy secrets); the local runtime runs anywhere and isolates nothing."""

log = logging.getLogger("rollout_ray")
_said: set[str] = set()


_registry: dict[str, Provider] = {}
_loaded = False


def register(provider: Provider) -> Provider:
    """Add ``provider`` (replacing one of the same name); returns it."""
    if provider.name == AUTO:
        raise ValueError(f"provider name {AUTO!r} is reserved: name the provider otherwise")
    _registry[provider.name] = provider
    return provider


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    from .local import LocalRuntime
    from .routes import sandbox_url
    from .sandbox import MEMORY_LIMIT, SandboxRuntime, sandbox_unavailable

    def local(name: str, image: str | None, r: HostResources) -> Runtime:
        return LocalRuntime(name, root=r.root, env=r.env, cgroup_parents=r.cgroup_parents, image=image)

    def sandbox(name: str, image: str | None, r: HostResources) -> Runtime:
        memory = r.budget.memory_bytes if r.budget is not None else None
        return SandboxRuntime(
            name,
            root=r.root,
            env=r.env,
            cgroup_parents=r.cgroup_parents,
            image=image,
            keeper=r.keeper,
            start_gates=r.start_gates,
            memory_limit=memory or MEMORY_LIMIT,
        )

    register(
        Provider(
            "local",
            local,
            Capabilities(),
            enforces=LocalRuntime.enforces,
            label="LocalRuntime",
            help="a private dir on the host, no isolation",
        )
    )
    register(
        Provider(
            "sandbox",
            sandbox,
            Capabilities(isolation=True, images=True, snapshots=True, grader_files=True, warm_pool=True, routes=True),
            unavailable=sandbox_unavailable,
            enforces=SandboxRuntime.enforces,
            host_url=sandbox_url,
            cgroup_controllers=lambda: ("pids", "memory"),
            help="bubblewrap: unprivileged, only the system and the framework routes; the default where "
            "the machine runs one",
        )
    )
    from . import podman

    register(podman.PROVIDER)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            register(point.load())
        except Exception as e:  # noqa: BLE001 - one broken plugin does not take the built-in kinds down
            log.warning("runtime provider %r (entry point %s) failed to load: %s", point.name, point.value, e)


def names() -> tuple[str, ...]:
    """The kinds a user may ask for: ``auto`` and every registered provider."""
    _load()
    return (AUTO, *_registry)


def provider(name: str) -> Provider:
    """The provider named ``name``.

    Raises:
        ValueError: no such provider, naming the ones there are.
    """
    _load()
    found = _registry.get(name)
    if found is None:
        raise ValueError(
            f"runtime must be one of {names()}, got {name!r}: pass one of these, or install "
            f"the package declaring it (entry point group {ENTRY_POINT_GROUP!r})"
        )
    return found


def resolve(kind: str) -> tuple[str, str | None]:
    """``(the kind to use, why not the first of AUTO_ORDER)`` for a requested kind.

    ``auto`` is the first of ``AUTO_ORDER`` this machine runs; when that is not the first,
    the reason (logged once per process).

    Raises:
        ValueError: an unknown kind.
    """
    if kind != AUTO:
        return provider(kind).name, None
    first_reason = None
    for name in AUTO_ORDER:
        reason = provider(name).unavailable()
        if reason is None:
            if first_reason is not None and first_reason not in _said:
                _said.add(first_reason)
                log.warning(
                    "this machine cannot run the %s runtime (%s): rollouts run in the %s runtime, which "
                    "isolates them neither from each other nor from the host",
                    AUTO_ORDER[0],
                    first_reason,
                    name,
                )
            return name, first_reason
        first_reason = first_reason or reason
    raise ValueError(f"no runtime of {AUTO_ORDER} can run here ({first_reason}): pass --runtime NAME")
