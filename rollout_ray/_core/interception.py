"""Interception: where a rollout's session is served to its harness.

A rollout *acquires a slot* — ``(base_url, model_secret, state_secret)`` — for the length of
its run; the harness talks to ``base_url`` with ``model_secret`` as its bearer. One
interception multiplexes many rollouts by secret. ``LocalInterception`` serves sessions to
harnesses in the same process (tests, in-process agents); the HTTP proxy of the wire layer
implements the same interface.
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

from .._errors import Unauthorized
from .._record.messages import Request, Response
from .session import RolloutSession


@dataclass(frozen=True)
class Slot:
    """What registering a session hands its harness: where to connect, and with which secrets.

    The registration itself (how to end it, whose it is) stays with the interception that
    holds it (``_Registration`` in the proxy, the tool server and a node's services)."""

    base_url: str
    model_secret: str
    state_secret: str


class ChatClient(ABC):
    """An in-process path from a harness to its rollout's model boundary."""

    @abstractmethod
    async def chat(self, request: Request) -> Response:
        """Send one request; raises ``Refusal`` subclasses and stashed ``RolloutError``s."""


class Interception(ABC):
    """Serves rollout sessions to harnesses."""

    @abstractmethod
    def serve(self, session: RolloutSession) -> AbstractAsyncContextManager[Slot]:
        """An async context manager: register ``session`` and yield its slot.

        On exit the session is unregistered and released (sealed: no late turn).
        """

    @abstractmethod
    def client(self, slot: Slot) -> ChatClient | None:
        """An in-process client for ``slot``, or ``None`` if only the wire path exists."""

    async def prepare_users(self, session: RolloutSession, request: Request) -> Request:
        """Run ``session.prepare_users`` where the live session is (B15, B25)."""
        return await session.prepare_users(request)

    async def sync(self, session: RolloutSession) -> None:
        """Bring ``session`` and its trace up to date with the live session.

        A no-op when the session is served in this process; an interception that serves
        it elsewhere (another process or actor) copies back what its proxy committed.
        """


class LocalInterception(Interception):
    """In-process interception: sessions in a dict keyed by their model secret."""

    base_url = "inprocess://interception"

    def __init__(self) -> None:
        self._sessions: dict[str, RolloutSession] = {}

    @property
    def load(self) -> int:
        """Number of registered sessions."""
        return len(self._sessions)

    @asynccontextmanager
    async def serve(self, session: RolloutSession) -> AsyncIterator[Slot]:
        slot = Slot(self.base_url, secrets.token_urlsafe(16), secrets.token_urlsafe(16))
        self._sessions[slot.model_secret] = session
        try:
            yield slot
        finally:
            self._sessions.pop(slot.model_secret, None)
            session.release()

    def client(self, slot: Slot) -> ChatClient:
        return _LocalClient(self, slot.model_secret)

    async def chat(self, secret: str, request: Request) -> Response:
        session = self._sessions.get(secret)
        if session is None:
            raise Unauthorized()
        return await session.chat(request)


class _LocalClient(ChatClient):
    def __init__(self, interception: LocalInterception, secret: str) -> None:
        self._interception = interception
        self._secret = secret

    async def chat(self, request: Request) -> Response:
        return await self._interception.chat(self._secret, request)
