"""The upstream model as the model boundary sees it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Self

from .._record.messages import Request, Response
from .policy_gate import Interrupt

SESSION_ID: ContextVar[str | None] = ContextVar("rollout_ray_session_id", default=None)
"""The trace id of the rollout whose model call runs in this context (``RolloutSession`` sets
it around ``complete``); a model client routes and tags the call by it (``X-Session-ID``)."""


@dataclass
class CallContext:
    """What the session knows of one model call beyond its request (``Model.generate``)."""

    prefix_ids: list[int] | None = None
    """The token ids the conversation already has on the request's branch: the prompt and the
    completion of the nearest earlier turn that recorded ids (``None``: none did). A client
    that sends token ids builds the prompt from them (token in, token out)."""
    prefix_messages: int = 0
    """How many of the request's messages ``prefix_ids`` holds (through that turn's reply)."""
    interrupt: Interrupt | None = None
    """Fired when a pause interrupts the call; a client that can stop and continue it arms it."""


class Interrupted(Exception):
    """A model call stopped before its end (an interrupting pause, or its server aborted it),
    with what it sampled: ``Model.resume`` continues it.

    Args:
        sampled: completion tokens sampled so far (kept, continued from).
        state: whatever the client needs to continue (opaque to the session).
    """

    def __init__(self, sampled: int, state: Any) -> None:
        super().__init__(f"model call interrupted after {sampled} tokens")
        self.sampled = sampled
        self.state = state


class Model(ABC):
    """An OpenAI-compatible chat model (a real endpoint, or a fake in tests).

    ``complete`` raises ``ProviderError`` (with the provider's status) for every failure of
    the provider, and ``OverlongPromptError`` when the prompt exceeds the context window.
    ``async with model:`` closes its connections at the end (``aclose``).
    """

    name: str | None = None
    shareable: bool = False
    """True when one instance may serve many rollouts (a stateless client with a pool)."""
    forward_fields: frozenset[str] = frozenset()
    """Request fields of a harness that go upstream beyond ``sampling.FORWARDED_FIELDS``
    (the operator's choice; see ``_core/upstream_fields``)."""

    @abstractmethod
    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Response:
        """Sample one reply to ``request``."""

    async def generate(
        self, request: Request, *, model: str | None, sampling: dict[str, Any], call: CallContext
    ) -> Response:
        """Sample one reply to ``request``, knowing ``call``: the session's entry point. A client
        that sends token ids or can be interrupted overrides it (raising ``Interrupted`` when
        stopped); this one is ``complete``."""
        return await self.complete(request, model=model, sampling=sampling)

    async def resume(
        self,
        request: Request,
        interrupted: Interrupted,
        *,
        model: str | None,
        sampling: dict[str, Any],
        call: CallContext,
    ) -> Response:
        """Continue the call ``interrupted`` stopped: the whole reply (what it sampled, then the
        rest), or ``Interrupted`` again. Only a model whose ``generate`` raises it is asked."""
        raise NotImplementedError(f"{type(self).__name__} does not continue interrupted calls")

    async def aclose(self) -> None:
        """Release connections held by the client (a later call opens new ones)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
