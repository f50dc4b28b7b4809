"""Decoding on the engine's clock: each choice a token at a time, each token under the policy
version current when it is produced (``engine_state.py``), and continuing a completion given so far.

A choice's plan under version ``v`` is its whole completion as the model at ``v`` writes it
(``completion.choose``, unscored). Token ``j`` is the plan's token ``j`` under the version of
the moment, scored as the model at ``v`` scores what is really there (``logprobs.Scorer``,
causal: the teacher-forced numbers, which are the plan's own while the tokens so far are). So a completion continued under an unchanged version is the
uninterrupted one, token for token and number for number; across a version change, the tokens
before it are the old model's and those after it the new one's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .completion import Choice, deltas
from .engine_state import Engine, Flight
from .logprobs import Scored, Scorer
from .tokenizer import IM_END, decode

__all__ = ["FLUSH", "Decoder", "Token", "produce"]

FLUSH = 0.01
"""Least seconds between two wake-ups of a generation: tokens due closer are sent together."""
BATCH = 16
"""Most decoding steps between two yields to the event loop: a generation far behind its clock
(the server is overloaded) catches up in slices, and an abort or a pause still gets through."""


@dataclass(frozen=True, slots=True)
class Token:
    """One produced token of choice ``index``: what a chunk reports."""

    index: int
    id: int
    scored: Scored | None
    delta: dict[str, Any]
    version: int
    last: bool


class Decoder:
    """One choice, decoded a token at a time; ``prefix``: the completion so far (continued)."""

    def __init__(self, index: int, plan: Callable[[int], Choice], prefix: Sequence[int] = ()) -> None:
        self.index = index
        self.ids = list(prefix)
        self.start = len(self.ids)
        self.versions: list[int] = []
        self.scored: list[Scored] = []
        self.finish: str | None = None
        self._plan = plan
        self._plans: dict[int, tuple[Choice, list[dict[str, Any]]]] = {}
        self._scorer: tuple[int, Scorer] | None = None
        self._last: Choice | None = None

    def plan(self, version: int) -> Choice:
        """The whole completion as the model at ``version`` writes it."""
        if version not in self._plans:
            self._plans[version] = self._plan(version), []
        return self._plans[version][0]

    def remaining(self, version: int) -> int:
        return 0 if self.finish else max(0, len(self.plan(version).ids) - len(self.ids))

    def step(self, version: int) -> Token | None:
        """The next token under ``version``; ``None`` when the completion is over."""
        plan = self._last = self.plan(version)
        j = len(self.ids)
        if self.finish or j >= len(plan.ids):
            self.finish = self.finish or plan.finish
            return None
        token = plan.ids[j]
        scored = self._score(version, plan, token)
        self.ids.append(token)
        self.versions.append(version)
        if scored is not None:
            self.scored.append(scored)
        last = j + 1 == len(plan.ids)
        if last:
            self.finish = plan.finish
        return Token(self.index, token, scored, self._delta(version, j), version, last)

    def abort(self) -> None:
        self.finish = self.finish or "abort"

    def _score(self, version: int, plan: Choice, token: int) -> Scored | None:
        if not plan.greedy:  # no logprobs asked for
            return None
        if self._scorer is None or self._scorer[0] != version:
            self._scorer = version, Scorer(plan.greedy, plan.material, self.ids)
        return self._scorer[1].next(token)

    def _delta(self, version: int, j: int) -> dict[str, Any]:
        plan, shown = self._plans[version]
        if not shown:
            shown += deltas(plan)
        return shown[j]

    def choice(self, version: int) -> Choice:
        """The choice as decoded so far (the whole of it once ``finish`` is set); ``version``:
        whose plan frames it if no token was decoded."""
        plan = self._last or self.plan(version)
        ids = self.ids[self.start :]
        return replace(
            plan,
            message=_message(plan, self.ids, self.finish),
            finish=self.finish or "abort",
            tokens=len(ids),
            ids=tuple(ids),
            scored=tuple(self.scored),
        )


def _message(plan: Choice, ids: list[int], finish: str | None) -> dict[str, Any]:
    """The message of ``ids``: the plan's, with the content that was really written."""
    if ids == list(plan.ids):
        return plan.message
    if finish == "tool_calls":  # the calls are the plan's; only the preamble can differ
        return {**plan.message, "content": decode(ids[: plan.preamble]) or plan.message.get("content")}
    text = decode(ids[:-1] if ids[-1:] == [IM_END] else ids)
    return {"role": "assistant", "content": text}


async def produce(
    engine: Engine,
    flight: Flight,
    decoders: list[Decoder],
    ttft: float,
    per_token: float,
    emit: Callable[[list[Token]], Awaitable[None]],
    *,
    stream: bool = True,
) -> bool:
    """Decode on the engine's clock until every choice is over (``True``) or the flight is
    aborted (``False``; each decoder's finish is then ``"abort"``). ``emit`` gets the tokens
    produced at each wake-up (``[]`` once at ``ttft``: the stream opens). Not ``stream``: wake
    only when the engine changes or the last token is due."""
    produced, opened = 0, False
    while True:
        now = flight.elapsed()
        batch: list[Token] = []
        steps = 0
        while not all(d.finish for d in decoders) and ttft + (produced + 1) * per_token <= now and steps < BATCH:
            version = engine.version_at(flight.start + ttft + (produced + 1) * per_token)
            batch += [t for d in decoders if (t := d.step(version)) is not None]
            produced, steps = produced + 1, steps + 1
        if batch or (not opened and now >= ttft):
            opened = True
            await emit(batch)
        if all(d.finish for d in decoders):
            return True
        if flight.aborted:
            for d in decoders:
                d.abort()
            return False
        if steps == BATCH:  # behind the clock: let the others (and the control routes) run
            await asyncio.sleep(0)
            continue
        ahead = 1 if stream else max(d.remaining(engine.version) for d in decoders)
        due = ttft if not opened else ttft + (produced + max(1, ahead)) * per_token
        await flight.until(max(due, now + FLUSH) if opened else due)
