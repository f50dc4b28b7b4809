"""NodeServices: the proxy and the tool server of one node, for rollouts in other processes.

What a node's services actor runs (one per node). A rollout registers its session here (a
``SessionSpec``: a copy of its trace, its hooks, limits and model) and, if its task has
tools, its toolsets under the session's state secret; a program of the rollout then talks
to this process's proxy and tool server. The copy of the trace here is where turns are
committed, hooks run and tool calls are recorded while the registration lives; the rollout
pulls what was added as ``SessionDelta``s (see ``_hosting/trace_sync`` for who owns what).
Models are pooled by configuration: rollouts of one model share one keep-alive pool.

Every registration has an owner (a rollout actor) holding a lease: the owner renews it every
few seconds, and ``reap`` drops everything of an owner whose lease ran out — an owner that
died, or whose driver died and took it along — so nothing is held for the dead.
"""

from __future__ import annotations

import contextlib
import pickle
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._core.interception import Slot
from .._core.model import Model
from .._core.runtime import Runtime
from .._core.session import RolloutSession
from .._core.toolset import Toolset
from .._errors import InfrastructureLost
from .._record.messages import Request
from .._serving.http_service import DEFAULT_MAX_BODY_BYTES_IN_FLIGHT, BodyBudget
from .._serving.proxy import HTTPInterception
from .._serving.tool_server import ToolServer
from .trace_sync import Cursor, SessionDelta, SessionSpec, delta

LEASE_SECONDS = 5.0
"""How long an owner's registrations live without a renewal."""


def lost_session() -> InfrastructureLost:
    """A rollout names a session these services do not hold. Rollouts name only sessions
    they registered here, so these services lost it: they were restarted since (their process
    died) or the owner's lease ran out. The rollout's turns held here are gone with it, so it
    is retried, not recorded as a failure of its task or harness."""
    return InfrastructureLost(
        "the node's services no longer hold this rollout's session (restarted, or its owner's lease ran out)"
    )


@dataclass
class _Registration:
    """One session or toolset registered here: how to end it, its owner, its session."""

    serving: contextlib.AbstractAsyncContextManager[Any]
    owner: str | None
    session: RolloutSession | None = None


class NodeServices:
    """One HTTP proxy, one tool server and a model pool, serving many remote rollouts.

    Args:
        host / advertise_host / max_body: as for ``HTTPInterception`` (``max_body`` for the
            proxy only).
        max_body_bytes_in_flight: request body bytes the proxy and the tool server hold at
            once, together (``BodyBudget``).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        advertise_host: str | None = None,
        max_body: int | None = None,
        lease: float = LEASE_SECONDS,
        max_body_bytes_in_flight: int = DEFAULT_MAX_BODY_BYTES_IN_FLIGHT,
    ) -> None:
        proxy_options: dict[str, Any] = {"max_body": max_body} if max_body else {}
        # One bound on the request bodies the node holds, whichever server they arrive at.
        self.body_budget = BodyBudget(max_body_bytes_in_flight)
        self._proxy = HTTPInterception(
            host=host, advertise_host=advertise_host, body_budget=self.body_budget, **proxy_options
        )
        self._tools = ToolServer(
            host=host,
            advertise_host=advertise_host,
            body_budget=self.body_budget,
            sessions=self._proxy.session_of_state,
        )
        self._models: dict[bytes, Model] = {}
        self._sessions: dict[str, _Registration] = {}
        self._toolsets: dict[str, _Registration] = {}
        self.lease = lease
        self._leases: dict[str, float] = {}
        """Owner → the monotonic time its registrations expire."""

    async def _started(self) -> None:
        if not self._proxy.base_url:
            await self._proxy.start()
        if not self._tools.base_url:
            await self._tools.start()

    def _pooled(self, model: Model) -> Model:
        # Same configuration, same object: its connection pool is shared.
        if not model.shareable:
            return model
        return self._models.setdefault(pickle.dumps(model), model)

    # -- sessions ---------------------------------------------------------------------------

    async def register(self, spec: SessionSpec) -> Slot:
        """Serve a copy of the rollout's session; returns its slot on this node's proxy."""
        await self._started()
        self.renew(spec.owner)
        session = spec.session(self._pooled(spec.model))
        serving = self._proxy.serve(session)
        slot = await serving.__aenter__()
        self._sessions[slot.model_secret] = _Registration(serving, spec.owner, session)
        return slot

    def _session(self, secret: str) -> RolloutSession:
        served = self._sessions.get(secret)
        if served is None or served.session is None:
            raise lost_session()
        return served.session

    async def prepare_users(self, secret: str, request: Request) -> Request:
        return await self._session(secret).prepare_users(request)

    async def sync(self, secret: str, since: Cursor) -> SessionDelta:
        """What the session's copy added since ``since``."""
        return delta(self._session(secret), since)

    async def unregister(self, secret: str, since: Cursor) -> SessionDelta | None:
        """Seal the session and return what it added since ``since`` (None: not registered)."""
        served = self._sessions.pop(secret, None)
        if served is None or served.session is None:
            return None
        await served.serving.__aexit__(None, None, None)
        return delta(served.session, since)

    # -- tools ------------------------------------------------------------------------------

    async def register_tools(
        self, toolsets: Sequence[Toolset], runtime: Runtime | None, state_secret: str, owner: str | None = None
    ) -> tuple[str, dict[str, str]]:
        """Serve a rollout's toolsets; each call is recorded on its session's trace copy.

        Returns a key for ``unregister_tools`` and the URLs by toolset name.

        Raises:
            InfrastructureLost: no session is registered here under ``state_secret`` (see
                ``lost_session``).
        """
        await self._started()
        self.renew(owner)
        session = self._proxy.session_of_state(state_secret)
        if session is None:
            raise lost_session()
        serving = self._tools.serve(toolsets, runtime, state_secret, on_call=session.trace.tool_calls.append)
        urls = await serving.__aenter__()
        key = secrets.token_urlsafe(16)
        self._toolsets[key] = _Registration(serving, owner)
        return key, urls

    async def unregister_tools(self, key: str) -> None:
        served = self._toolsets.pop(key, None)
        if served is not None:
            await served.serving.__aexit__(None, None, None)

    # -- owners -----------------------------------------------------------------------------

    def renew(self, owner: str | None, now: float | None = None) -> None:
        """Extend ``owner``'s lease by ``lease`` seconds from ``now`` (monotonic)."""
        if owner is not None:
            self._leases[owner] = (time.monotonic() if now is None else now) + self.lease

    async def reap(self, now: float | None = None) -> int:
        """Drop the registrations of every owner whose lease ran out; returns how many."""
        now = time.monotonic() if now is None else now
        dropped = 0
        for owner in [o for o, expires in self._leases.items() if expires <= now]:
            del self._leases[owner]
            dropped += await self.drop_owner(owner)
        return dropped

    async def drop_owner(self, owner: str) -> int:
        """Seal and forget everything ``owner`` registered (it died); returns how many."""
        keys = [k for k, s in self._toolsets.items() if s.owner == owner]
        for key in keys:
            await self.unregister_tools(key)
        secrets_ = [k for k, s in self._sessions.items() if s.owner == owner]
        for secret in secrets_:
            await self.unregister(secret, Cursor())
        return len(keys) + len(secrets_)

    def load(self, owner: str | None = None) -> int:
        """Registrations held: all of them, or those ``owner`` made."""
        served = [*self._sessions.values(), *self._toolsets.values()]
        return len(served) if owner is None else sum(1 for s in served if s.owner == owner)

    async def shutdown(self) -> None:
        for key in list(self._toolsets):
            await self.unregister_tools(key)
        for secret in list(self._sessions):
            await self.unregister(secret, Cursor())
        await self._tools.stop()
        await self._proxy.stop()
        for model in self._models.values():
            await model.aclose()
        self._models.clear()
