"""The knobs a run is steered by while it runs, wired together for the driver.

The in-flight bound (``Slots``), set by ``max_in_flight`` or, with ``"auto"``, by the
controller that follows the servers' ``/metrics`` (``AutoInFlight``); the operator's steering
(``Steering``: cancel, requeue, set the bound, stop) and, with a run directory, its control
endpoint (``ControlServer``, what ``rollout-ray ctl`` talks to). The driver runs its rollouts
through ``slots`` and ``steering`` and opens and closes the rest here, so its own module is
the run, not the wiring.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

from .._core.model import Model
from .._hosting.executor import Executor
from .auto_in_flight import AutoInFlight, fleet_roots
from .control import ControlServer
from .progress import Progress
from .slots import Slots
from .steering import Steering

__all__ = ["LiveControls"]


class LiveControls:
    """The run's slots, adaptive bound, steering and control endpoint: made with the driver,
    started when its run starts (``start``), closed when it ends (``stop_sampling`` as the
    rollouts end, ``aclose`` once the run's state is final)."""

    def __init__(
        self,
        executor: Executor,
        progress: Progress,
        model: Model,
        max_in_flight: int | Literal["auto"],
        *,
        stop: Callable[[], None],
    ) -> None:
        self.slots = Slots(AutoInFlight.start(max_in_flight))
        self.auto = AutoInFlight(self.slots, fleet_roots(model)) if max_in_flight == "auto" else None
        """``max_in_flight="auto"``: the controller that sets the bound from the servers' /metrics."""
        self.steering = Steering(executor, progress, self.slots, stop=stop, auto=self.auto)
        self._control: ControlServer | None = None
        self._sampler: asyncio.Task[None] | None = None

    async def start(self, run_dir: str | None, run_id: str) -> None:
        """The control endpoint (with a run directory), and the first bound from the fleet as
        it is, before any rollout, then the controller's loop."""
        if run_dir is not None:
            self._control = ControlServer(self.steering, run_dir, run_id=run_id)
            await self._control.start()
        if self.auto is not None:
            await self.auto.sample()
            self._sampler = asyncio.create_task(self.auto.run())

    async def stop_sampling(self) -> None:
        """The controller stops: no rollout is started any more."""
        if self._sampler is not None:
            self._sampler.cancel()
            await asyncio.gather(self._sampler, return_exceptions=True)
        if self.auto is not None:
            await self.auto.aclose()

    async def aclose(self, status: str, reason: str) -> None:
        """The control endpoint says how the run ended (``status``, ``reason``) and closes."""
        if self._control is not None:
            await self._control.aclose(status, reason)

    def report(self, progress: Progress) -> None:
        """The controller's target and why, on ``progress`` (with ``"auto"``)."""
        if self.auto is not None:
            progress.target, progress.target_why = self.auto.target.target, self.auto.status()["why"]
