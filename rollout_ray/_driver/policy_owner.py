"""The driver's side of the policy: its version and the weight-update pause (asynchronous RL).

The driver owns the current policy version and the pause; ``Executor.set_policy`` carries
both to every process where its rollouts make model calls or are charged agent time
(``_core/policy_gate``). Versions only go up. ``Driver`` inherits this.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .._hosting.executor import Executor


class PolicyOwner:
    """The policy API of ``Driver``: ``policy_version``, ``pause``, ``resume``, ``paused``."""

    executor: Executor

    def _init_policy(self, version: int) -> None:
        self._policy_version, self._paused = version, False
        self._policy_lock = asyncio.Lock()

    @property
    def policy_version(self) -> int:
        """The current policy version: what a model call records when its server stamps none."""
        return self._policy_version

    async def set_policy_version(self, version: int) -> None:
        """Make ``version`` current: the next model calls carry it.

        Raises:
            ValueError: ``version`` is below the current one (versions only go up).
        """
        await self._set_policy(version, self._paused)

    async def pause(self, interrupt: bool = False) -> None:
        """Hold every new model call before it goes upstream (e.g. for a weight update).

        Calls already sent finish (``interrupt=False``), or are interrupted: stopped at their
        servers, what they sampled kept, and continued from it after the resume, under the
        new version (``interrupt=True``; a call to a server that takes no token ids finishes
        instead, said once in the log). Held calls count toward no limit or timeout, and paused
        time is not charged to any rollout's agent budget. Returns once every process where
        the rollouts make model calls is paused (and, interrupting, every interrupted call
        has stopped).
        """
        await self._set_policy(self._policy_version, True, interrupt)

    async def resume(self, version: int | None = None) -> None:
        """Let model calls go upstream again, carrying ``version`` if given (else the current one).

        Raises:
            ValueError: ``version`` is below the current one.
        """
        await self._set_policy(self._policy_version if version is None else version, False)

    @asynccontextmanager
    async def paused(self, version: int | None = None, *, interrupt: bool = False) -> AsyncIterator[None]:
        """``pause(interrupt)`` for the block, then ``resume(version)``: the trainer's weight sync.

        With ``interrupt=True`` the block starts once no model call is generating: load the
        new weights into the servers there (``reload_weights`` does it for vLLM and SGLang);
        the interrupted calls continue after it under ``version``.

        If the block raises, the run resumes at the version it had (the update failed).
        """
        await self.pause(interrupt)
        try:
            yield
        except BaseException:
            await self.resume()
            raise
        await self.resume(version)

    async def _set_policy(self, version: int, paused: bool, interrupt: bool = False) -> None:
        if version < self._policy_version:
            raise ValueError(f"policy version must not go back: {version} is below the current {self._policy_version}")
        async with self._policy_lock:
            self._policy_version, self._paused = version, paused
            if interrupt:
                await self.executor.set_policy(version, paused, interrupt=True)
            else:  # an executor written before interrupts takes two arguments
                await self.executor.set_policy(version, paused)

    async def _announce_policy(self) -> None:
        """Tell the executor the policy as it stands (it may have served another driver)."""
        async with self._policy_lock:
            await self.executor.set_policy(self._policy_version, self._paused)
