"""Segment: how one segment of a rollout ended, and the failure it leaves (B22–B30).

A segment is one run of the harness (launch, or resume with new user turns). What it raised
is judged only once the rollout's trace holds what its proxy committed meanwhile: a refusal
raised because a limit or ``@stop`` stopped the session is a stop, not a failure, and a
provider error the proxy stashed explains the harness error it caused.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import HarnessError, RolloutError
from .session import RolloutSession


@dataclass
class Segment:
    """How one segment ended, before the trace holds what its proxy committed."""

    turns_before: int
    """Turns on the trace when the segment began."""
    raised: Exception | None = None
    """What the harness raised, if anything."""
    expired: bool = False
    """The agent budget ran out during the segment."""

    def failure(self, session: RolloutSession, agent_budget: float | None) -> Exception | None:
        """The error to record for the segment, or ``None`` (it raised nothing, or it was
        refused because the session stopped)."""
        error = self.raised
        if error is None:
            return None
        if isinstance(error, TimeoutError):
            if not self.expired:
                return error
            timeout = HarnessError(f"agent timeout: rollout exceeded its {agent_budget:g}s budget")
            timeout.__cause__ = error
            return timeout
        if session.stopped:
            return None
        stashed = session.error
        if isinstance(error, RolloutError) and stashed is not None:
            stashed.__cause__ = error
            return stashed
        return error
