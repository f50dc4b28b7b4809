"""The upstream model as the model boundary sees it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextvars import ContextVar
from typing import Any, Self

from .._record.messages import Request, Response

SESSION_ID: ContextVar[str | None] = ContextVar("rollout_ray_session_id", default=None)
"""The trace id of the rollout whose model call runs in this context (``RolloutSession`` sets
it around ``complete``); a model client routes and tags the call by it (``X-Session-ID``)."""


class Model(ABC):
    """An OpenAI-compatible chat model (a real endpoint, or a fake in tests).

    ``complete`` raises ``ProviderError`` (with the provider's status) for every failure of
    the provider, and ``OverlongPromptError`` when the prompt exceeds the context window.
    ``async with model:`` closes its connections at the end (``aclose``).
    """

    name: str | None = None
    shareable: bool = False
    """True when one instance may serve many rollouts (a stateless client with a pool)."""

    @abstractmethod
    async def complete(
        self, request: Request, *, model: str | None, sampling: dict[str, Any]
    ) -> Response:
        """Sample one reply to ``request``."""

    async def aclose(self) -> None:
        """Release connections held by the client (a later call opens new ones)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
