"""RayExecutor: the driver's rollouts on a pool of long-lived rollout actors."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import site
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._core.task import Task
from .._errors import InfrastructureLost
from .._hosting.executor import Executor, failed_trace
from .._hosting.lookahead import wanted
from .._hosting.spec import RolloutSpec
from .._record.trace import Trace
from .._runtimes.host import runtime_kind
from .._runtimes.start_gate import StartLimits
from .calls import SHUTDOWN_GRACE, call
from .head import init_ray
from .rollout_client import RolloutActor
from .start_limiter import create_limiter

log = logging.getLogger("rollout_ray")

_SPREAD = {"scheduling_strategy": "SPREAD"}
LIVE_TIMEOUT = 5.0
"""Seconds a rollout actor has to answer a live run's status poll."""
UNCAPPED = 1_000_000
"""An actor's capacity when the executor sets none: the caller's bound is the only one."""


class RayExecutor(Executor):
    """Spreads rollouts over ``actors`` rollout actors of ``capacity`` each.

    An actor that dies is replaced on its next use, and the rollouts it held come back lost
    at once (Ray fails the pending calls; ``failed_trace`` with an ``InfrastructureLost``),
    never hang. An actor that hangs (its event loop stuck: it answers no ``ping`` within
    ``probe_timeout``) is killed, so its rollouts come back lost too.

    Without an address (argument or ``RAY_ADDRESS``) it starts a private Ray instance bound
    to 127.0.0.1 — never a cluster that happens to run on the machine. The modules of a
    spec's task, harness and model that the actors cannot import (a file next to the
    driver's script, ``__main__``, a taskset loaded from a path) travel by value, with the
    plain modules beside them that they imported.

    Args:
        actors: number of rollout actors (spread over the cluster's nodes); ``None``: one per
            CPU of the cluster, at most ``DEFAULT_ACTORS_CAP`` (a private local Ray has the
            machine's CPUs).
        capacity: rollouts per actor at once (K); ``None``: no cap per actor, the caller's own
            bound (the driver's ``max_in_flight``) is the only one, spread evenly over the
            actors. A cap below the driver's makes rollouts wait in the actors, so the
            driver warns.
        address: Ray address to connect to; ``None``: ``RAY_ADDRESS``, else a private local Ray.
        actor_options: ``.options()`` of the pool's actors (e.g. custom resources or a
            scheduling strategy): one mapping for all, or one per actor. Default: round-robin
            over the nodes alive at start (soft node affinity).
        replacement_options: ``.options()`` of an actor replacing a dead one. Not the dead
            actor's own: those may pin it to a node that is gone, and an actor that cannot be
            placed would hold its rollouts forever. Default: spread.
        runtime: the kind of the runtimes rollouts own: ``"auto"`` (the sandbox where the
            nodes run one; ``runtime_reason`` says why not, as seen from this machine), or
            any provider's name (``"local"``, ``"sandbox"``, ``"podman"``, ...).
        probe_interval / probe_timeout: how often each actor is pinged, and how long it may
            take to answer before it counts as hung.
        sandbox_starts: the cluster's cap on sandbox starts (at once, a second), shared by every
            driver of the cluster (the first one's holds); each node has its own too
            (``ROLLOUT_RAY_NODE_STARTS``, ``ROLLOUT_RAY_NODE_START_RATE``). Default: none.
    """

    def __init__(
        self,
        *,
        actors: int | None = None,
        capacity: int | None = None,
        address: str | None = None,
        actor_options: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        replacement_options: Mapping[str, Any] | None = None,
        runtime: str = "auto",
        probe_interval: float = 2.0,
        probe_timeout: float = 30.0,
        sandbox_starts: StartLimits | None = None,
    ) -> None:
        if (actors is not None and actors < 1) or (capacity is not None and capacity < 1):
            raise ValueError(f"actors and capacity must be >= 1, got {actors} and {capacity}")
        options: list[dict[str, Any]] | dict[str, Any] | None
        if actor_options is None:
            options = None  # round-robin over the nodes alive at start
        elif isinstance(actor_options, Mapping):
            options = dict(actor_options)  # one for each actor, however many there will be
        else:
            options = [dict(o) for o in actor_options]
            if actors is None:
                actors = len(options)
            elif len(options) != actors:
                raise ValueError(f"actor_options must hold one mapping per actor ({actors}), got {len(options)}")
        self.actors, self.capacity, self.address, self.runtime = actors, capacity, address, runtime
        self.runtime_reason = runtime_kind(runtime)[1]
        self.probe_interval, self.probe_timeout = probe_interval, probe_timeout
        self._options = options
        self._replacement_options = dict(replacement_options or _SPREAD)
        self._pool: list[RolloutActor | None] = []
        self._load: list[int] = []
        self._turn = itertools.count()
        self._probes: set[asyncio.Task[None]] = set()
        self._shipped: set[type] = set()
        self.replaced = 0
        self._started_ray = False
        self.sandbox_starts = sandbox_starts
        self._limiter: Any = None
        self._prepared: tuple[dict[str, int], list[tuple[str, str]]] | None = None

    async def start(self) -> None:
        if not ray.is_initialized():
            init_ray(self.address)
            self._started_ray = True
        if self.sandbox_starts is not None:  # before the actors: their runtime actors look it up
            self._limiter = create_limiter(self.sandbox_starts)
        if self.actors is None:
            self.actors = default_actors()
        options = self._options
        if isinstance(options, dict):
            options = [options] * self.actors
        self._pool = [self._new_actor(o) for o in options or _round_robin(self.actors)]
        self._load = [0] * self.actors

    def _new_actor(self, options: Mapping[str, Any]) -> RolloutActor:
        actor = RolloutActor.create(
            capacity=self.capacity or UNCAPPED, runtime=self.runtime, policy=self._policy_state, **options
        )
        probe = asyncio.get_running_loop().create_task(self._probe(actor))
        self._probes.add(probe)
        probe.add_done_callback(self._probes.discard)
        return actor

    async def _probe(self, actor: RolloutActor) -> None:
        """Ping ``actor`` while it is in the pool; kill it if it stops answering."""
        # The first ping is unbounded: being placed and started is not hanging. But an actor
        # that answered anything else meanwhile has started, and may hang before the ping's
        # answer arrives: from then on the pings are bounded.
        first = asyncio.ensure_future(call(actor.actor.ping.remote()))
        try:
            while not first.done() and not actor.runs.answered:
                await asyncio.wait({first}, timeout=self.probe_interval)
            if first.done():
                first.result()
        except RayActorError:
            return
        finally:
            first.cancel()
        while actor in self._pool:
            await asyncio.sleep(self.probe_interval)
            try:
                await call(actor.actor.ping.remote(), timeout=self.probe_timeout)
            except TimeoutError:
                # Hung, not dead: Ray would wait on it forever. Killed, its pending calls fail.
                ray.kill(actor.actor, no_restart=True)
                return
            except RayActorError:
                return  # dead: ``run`` sees it

    async def ready(self, timeout: float | None = None, *, programs: bool = True) -> str:
        """Wait until every actor a rollout needs answers: each rollout actor and, with
        ``programs``, its runtime actor and the services actor of its node (the proxy and tool
        servers of programs run in a runtime). Actors start asynchronously; without this the
        first rollouts' ``setup`` would carry the wait. Returns what was waited for, in words.

        ``programs=False`` suits an in-process harness: its rollouts need neither unless a task
        uses a box, and then the first such rollout of each actor starts the runtime actor (its
        ``setup`` carries that, ~1-2 s).

        Raises:
            TimeoutError: one did not answer within ``timeout`` seconds.
        """
        actors = [a for a in self._pool if a is not None]

        async def answering(actor: RolloutActor) -> str:
            node = await call(actor.actor.node_id.remote(), timeout=timeout)
            # With an argument: an actor's first call with one builds Ray's serialization
            # context (importing pyarrow: ~1 s of CPU), which would land on a rollout.
            await call(actor.actor.warm.remote("warm-up"), timeout=timeout)
            if programs:
                runtimes = await call(actor.actor.start_services.remote(), timeout=timeout)
                await call(runtimes.alive.remote("warm-up"), timeout=timeout)
            return str(node)

        nodes = set(await asyncio.gather(*(answering(a) for a in actors)))
        plural = "s" if len(actors) != 1 else ""
        if not programs:
            return f"{len(actors)} rollout actor{plural} (runtime actors and node services: when first needed)"
        return (
            f"{len(actors)} rollout actor{plural} with their runtime actors, "
            f"the services of {len(nodes)} node{'s' if len(nodes) != 1 else ''}"
        )

    def _pick(self) -> int:
        # Least loaded; ties broken round-robin so an idle pool fills evenly.
        start = next(self._turn) % len(self._pool)
        order = [(start + i) % len(self._pool) for i in range(len(self._pool))]
        return min(order, key=lambda i: self._load[i])

    async def run(self, spec: RolloutSpec) -> Trace:
        self._ship_by_value(spec)
        index = self._pick()
        actor = self._pool[index]
        if actor is None:
            actor = self._pool[index] = self._new_actor(self._replacement_options)
            self.replaced += 1
        self._load[index] += 1
        try:
            return await actor.run(spec)
        except RayActorError as e:
            if self._pool[index] is actor:
                self._pool[index] = None  # replaced on next use
            return failed_trace(spec, InfrastructureLost(f"rollout actor died: {type(e).__name__}"))
        finally:
            self._load[index] -= 1

    async def prepare(self, upcoming: Sequence[Task], admitted: Sequence[Task] = ()) -> None:
        """Each actor's runtime actor hears its share of the rollouts coming over each image (its
        warm pool fills) and the shareable setups still needed; only when that changed, and
        never for a taskset without images."""
        images, setups = wanted(upcoming, admitted)
        actors = [a for a in self._pool if a is not None]
        share = {image: -(-n // len(actors)) for image, n in images.items()} if actors else {}
        message = (share, sorted(setups))
        if not actors or message == self._prepared or (self._prepared is None and not images and not setups):
            return
        self._prepared = message
        outcomes = await asyncio.gather(
            *(call(a.actor.prepare.remote(*message), timeout=self.probe_timeout) for a in actors),
            return_exceptions=True,
        )
        for outcome in outcomes:  # a dead or slow actor misses a warm pool: its rollouts start cold
            if isinstance(outcome, BaseException) and not isinstance(outcome, (RayActorError, TimeoutError)):
                raise outcome

    def _ship_by_value(self, spec: RolloutSpec) -> None:
        for cls in (type(spec.task), type(spec.harness), type(spec.model)):
            if cls not in self._shipped:
                self._shipped.add(cls)
                for module in modules_to_ship(cls):
                    ray.cloudpickle.register_pickle_by_value(module)

    async def stop(self) -> None:
        pool, self._pool = self._pool, []
        for probe in list(self._probes):
            probe.cancel()
        await asyncio.gather(*self._probes, return_exceptions=True)
        for actor in pool:
            if actor is not None:
                await actor.aclose(SHUTDOWN_GRACE)
        # The node's services actors are shared with every other driver on the
        # cluster, so they stay; a Ray started here goes, and takes them with it.
        if self._started_ray:
            ray.shutdown()

    _policy_state: tuple[int | None, bool] | None = None
    """The last ``set_policy``: an actor created later (a replacement) starts with it."""

    async def set_policy(self, version: int | None, paused: bool, interrupt: bool = False) -> None:
        """Every actor of the pool, and through each its node's services, sees ``version``
        and the pause (``interrupt``: and has stopped its interrupted calls); returns once
        they all answered. An actor that died is skipped (its replacement starts with them);
        one that does not answer within ``probe_timeout`` is logged, and the probe kills it
        as hung."""
        if self._policy_state == (version, paused) and not interrupt:
            return
        self._policy_state = (version, paused)
        actors = [a for a in self._pool if a is not None]
        outcomes = await asyncio.gather(
            *(a.set_policy(version, paused, interrupt, timeout=self.probe_timeout) for a in actors),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, TimeoutError):
                log.warning(
                    "a rollout actor did not take policy version=%s paused=%s within %gs",
                    version,
                    paused,
                    self.probe_timeout,
                )
            elif isinstance(outcome, BaseException) and not isinstance(outcome, RayActorError):
                raise outcome

    async def live(self) -> dict[str, Any]:
        """Every actor's ``live`` report, merged; an actor that does not answer within
        ``LIVE_TIMEOUT`` (dead, hung, busy) is left out: its rollouts read as queued."""
        actors = [a for a in self._pool if a is not None]
        answers = await asyncio.gather(
            *(call(a.actor.live.remote(), timeout=LIVE_TIMEOUT) for a in actors), return_exceptions=True
        )
        merged: dict[str, Any] = {"rollouts": [], "servers": []}
        for answer in answers:
            if isinstance(answer, dict):
                merged["rollouts"] += answer["rollouts"]
                merged["servers"] += answer["servers"]
            elif not isinstance(answer, (TimeoutError, RayActorError)):
                log.warning("a rollout actor's live report failed: %r", answer)
        return merged

    def statistics(self) -> dict[str, Any]:
        return {"actors": len(self._pool), "replaced": self.replaced, "in_flight": sum(self._load)}

    @property
    def looks_ahead(self) -> bool:
        return True

    @property
    def max_in_flight(self) -> int | None:
        """Rollouts this executor runs at once, at most (``None``: no bound of its own)."""
        return None if self.capacity is None or self.actors is None else self.actors * self.capacity


DEFAULT_ACTORS_CAP = 32
"""Most rollout actors ``actors=None`` makes, however many CPUs: each is a Python process
(0.5-0.9 CPU-s to start, and its memory), and rollouts are mostly waits on the model, so
beyond this a large cluster gains little from more of them."""


def default_actors() -> int:
    """One rollout actor per CPU of the connected cluster, at least 1, at most
    ``DEFAULT_ACTORS_CAP``."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return max(1, min(cpus, DEFAULT_ACTORS_CAP))


def modules_to_ship(cls: type) -> list[ModuleType]:
    """The modules of ``cls`` and its bases that Ray workers may be unable to import, each with
    the plain modules beside it (same folder) that it imported: they must travel by value."""
    found: list[ModuleType] = []
    for klass in cls.__mro__:
        module = sys.modules.get(klass.__module__)
        if module is not None and _private_to_driver(module) and module not in found:
            found.append(module)
            found += [m for m in _beside(module) if m not in found]
    return found


def _private_to_driver(module: ModuleType) -> bool:
    """Whether workers, which share the installed packages but not the driver's script
    directory or working directory, may fail to import ``module``."""
    if module.__name__ == "__main__":
        return True
    path = getattr(module, "__file__", None)
    if path is None or module.__name__.split(".")[0] in ("rollout_ray", *sys.stdlib_module_names):
        return False
    path = os.path.realpath(path)
    installed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *site.getsitepackages())}
    return not any(path.startswith(root + os.sep) for root in installed)


def _beside(module: ModuleType) -> list[ModuleType]:
    path = getattr(module, "__file__", None)
    if path is None:
        return []
    folder = os.path.dirname(os.path.abspath(path))
    return [
        m
        for m in list(sys.modules.values())
        if m is not module
        and (p := getattr(m, "__file__", None))
        and os.path.dirname(os.path.abspath(p)) == folder
        and not p.endswith("__init__.py")
    ]


def _round_robin(actors: int) -> list[dict[str, Any]]:
    """Actor i on alive node i mod n, softly (a node that is full or gone is not waited for).

    Not ``SPREAD``: Ray 2.60 does not reliably spread zero-CPU actors (on a local 3-node
    cluster, three landed on 1, 2 or 3 nodes), and a token CPU request to make it do so leaves
    a replacement actor unplaceable when the cluster's CPUs are all claimed.
    """
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    return [
        {"scheduling_strategy": NodeAffinitySchedulingStrategy(nodes[i % len(nodes)], soft=True)} for i in range(actors)
    ]
