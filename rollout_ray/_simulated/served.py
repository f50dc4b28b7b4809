"""What the route modules (``weight_routes``, ``generate``) use of the simulated model's server: a
protocol, so that they need not import ``model_server``, which adds their routes."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from .completion import Choice, Draw
from .config import SimulatedModelConfig
from .decoding import Decoder
from .engine_state import Engine, Flight
from .request import ChatCall
from .request_draws import Attempts

POLICY_HEADER = "X-Policy-Version"
"""The policy version an answer was produced under, on every response of the server."""


class Served(Protocol):
    """A simulated model server, as its routes see it."""

    config: SimulatedModelConfig
    engine: Engine
    attempts: Attempts
    stats: Any
    policy_version: int

    def plan(self, call: ChatCall, draw: Draw, index: int, version: int) -> Choice: ...

    def flight(self, rid: str) -> AbstractContextManager[Flight]: ...

    async def run(
        self, flight: Flight, decoders: list[Decoder], emit: Any = None, prompt: Sequence[int] = ()
    ) -> bool: ...
