"""Simulated users: a second agent that answers the policy's turns until it ends the conversation.

A task brings one with ``Task.user_simulator`` (tau-bench style customer-service tasks).
``Rollout.run`` then converses (``converse``): the policy's segment, the simulator's reply to
the dialogue so far, the next segment with that reply as a user turn (``Rollout.step``'s
``messages``, B25), until the simulator ends the conversation, the policy's step cannot
continue (B32) or the simulator has spoken ``max_turns`` times.

The simulator runs between segments, so its time is never charged to the agent's budget
(B24); its turns go to ``Trace.user_turns`` and its model calls with them, never to
``Trace.calls``: they count in no token limit and never enter the loss mask. A simulator that
fails is a ``UserSimulatorError``, so the simulator's faults are told apart from the policy's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .._errors import UserSimulatorError
from .._record.agent_branches import agent_messages
from .._record.messages import AssistantMessage, Message, Request, SystemMessage, UserMessage, text_of
from .._record.trace import ModelCall, TimeSpan, Trace, UserTurn
from .model import Model
from .task import Task


class Rollout(Protocol):
    """What ``converse`` needs of a ``Rollout`` (a protocol: the rollout imports this module)."""

    trace: Trace
    task: Task
    harness: Any
    harness_session: Any

    async def step(self, messages: Sequence[Message] | None = None) -> bool: ...

    def fail(self, error: BaseException) -> None: ...


class UserSimulator(ABC):
    """A simulated user. Subclass it and implement ``reply``.

    Args:
        name: who the turns are recorded as produced by (``UserTurn.by``).
        max_turns: replies at most (the opening one included); then the conversation ends.
        timeout: seconds one reply may take; past it the rollout fails with
            ``UserSimulatorError``.
    """

    def __init__(self, name: str = "user", *, max_turns: int = 10, timeout: float = 120.0) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.name, self.max_turns, self.timeout = name, max_turns, timeout

    @abstractmethod
    async def reply(self, dialogue: Sequence[Message]) -> UserTurn:
        """The next user turn given the dialogue so far (the policy's side of it: system
        prompt, user and assistant turns, tool traffic); ``done=True`` ends the conversation."""

    def attach(self, trace: Trace, client: Any) -> None:
        """Called once before the conversation with the rollout's trace and its in-process
        chat client (``None`` when the harness is not in process); a peer agent talks to the
        policy through it (``PeerAgent``)."""

    async def aclose(self) -> None:
        """Release what the simulator holds (its model's connections)."""


Rule = Callable[[Sequence[Message]], str | None]


class ScriptedUser(UserSimulator):
    """A user that follows a script: each item is a turn's text, or a function of the dialogue
    returning the text (``None`` ends the conversation). The script's end ends it too."""

    def __init__(self, turns: Sequence[str | Rule], name: str = "scripted_user", **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._turns = list(turns)
        self._next = 0

    async def reply(self, dialogue: Sequence[Message]) -> UserTurn:
        if self._next >= len(self._turns):
            return UserTurn(by=self.name, content="", done=True)
        item = self._turns[self._next]
        self._next += 1
        text = item(dialogue) if callable(item) else item
        return UserTurn(by=self.name, content=text or "", done=text is None)


class ModelUser(UserSimulator):
    """A user played by a model of its own (often a larger, frozen one), with its own prompt.

    It sees the dialogue with the roles swapped (the policy's replies are its user turns, its
    own earlier turns are its assistant turns; the task's prompt and the tool traffic are left
    out, as a customer sees neither). A reply containing ``stop`` ends the conversation.

    Args:
        model: the simulator's model client (e.g. ``OpenAIModel``), never the policy's session.
        system_prompt: who the user is and what it wants (the task's user instructions).
        model_name / sampling: sent with each of its calls.
        stop: the marker with which it ends the conversation (removed from the text).
    """

    def __init__(
        self,
        model: Model,
        system_prompt: str,
        name: str = "model_user",
        *,
        model_name: str | None = None,
        sampling: dict[str, Any] | None = None,
        stop: str = "###STOP###",
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        self.model, self.system_prompt, self.stop = model, system_prompt, stop
        self.model_name, self.sampling = model_name, dict(sampling or {})
        self._said: set[str] = set()

    def view(self, dialogue: Sequence[Message]) -> list[Message]:
        """The dialogue as the simulator sees it: its prompt, then the roles swapped."""
        seen: list[Message] = [SystemMessage(self.system_prompt)]
        for m in dialogue:
            if isinstance(m, UserMessage) and text_of(m.content) in self._said:
                seen.append(AssistantMessage(content=text_of(m.content)))
            elif isinstance(m, AssistantMessage) and m.content and not m.tool_calls:
                seen.append(UserMessage(text_of(m.content)))
        return seen

    async def reply(self, dialogue: Sequence[Message]) -> UserTurn:
        started = time.time()
        try:
            response = await self.model.complete(
                Request(self.view(dialogue)), model=self.model_name, sampling=self.sampling
            )
        except Exception as e:
            raise UserSimulatorError(f"user simulator {self.name!r}: its model failed: {e}") from e
        text = text_of(response.message.content or "")
        call = ModelCall(
            model=response.model or self.model_name or self.model.name,
            sampling=self.sampling or None,
            finish_reason=response.finish_reason,
            usage=response.usage,
            time=TimeSpan(started, time.time()),
        )
        content = text.replace(self.stop, "").strip()
        self._said.add(content)
        return UserTurn(by=self.name, content=content, done=self.stop in text, call=call)

    async def aclose(self) -> None:
        await self.model.aclose()


async def converse(rollout: Rollout, user: UserSimulator) -> None:
    """Run the policy against ``user`` until one of them ends the exchange (module docstring).
    A simulator that fails records ``UserSimulatorError`` on the trace."""
    trace = rollout.trace
    try:
        session = rollout.harness_session
        user.attach(trace, session.ctx.client if session is not None and rollout.harness.in_process else None)
        messages: list[Message] | None = None
        if rollout.task.data.prompt is None:  # the user opens the conversation
            turn = await _ask(rollout, user)
            if turn.done:
                return
            messages = [UserMessage(turn.content)]
        while True:  # bounded: every pass records a user turn, and max_turns of them end it
            seen = len(trace.nodes)
            if not await rollout.step(messages):
                return
            if messages is not None:
                _link(trace.nodes, seen, trace.user_turns[-1])
            if len(trace.user_turns) >= user.max_turns:
                return
            turn = await _ask(rollout, user)
            if turn.done:
                return
            messages = [UserMessage(turn.content)]
    except UserSimulatorError as e:
        rollout.fail(e)
    finally:
        # a simulator's teardown never discards the trajectory
        with contextlib.suppress(Exception):
            await asyncio.wait_for(user.aclose(), user.timeout)


async def _ask(rollout: Rollout, user: UserSimulator) -> UserTurn:
    """The simulator's next turn, bounded by its timeout, recorded on the trace."""
    try:
        turn = await asyncio.wait_for(user.reply(agent_messages(rollout.trace)), user.timeout)
    except TimeoutError as e:
        raise UserSimulatorError(f"user simulator {user.name!r} did not reply within {user.timeout:g}s") from e
    except UserSimulatorError:
        raise
    except Exception as e:
        raise UserSimulatorError(f"user simulator {user.name!r} raised {type(e).__name__}: {e}") from e
    if not isinstance(turn, UserTurn):
        raise UserSimulatorError(
            f"user simulator {user.name!r}: reply() must return a UserTurn, got {type(turn).__name__}"
        )
    rollout.trace.user_turns.append(turn)
    return turn


def _link(nodes: Sequence[Any], start: int, turn: UserTurn) -> None:
    """Point ``turn`` at the user message node the agent received (added since ``start``)."""
    for i in range(start, len(nodes)):
        message = nodes[i].message
        if isinstance(message, UserMessage) and text_of(message.content) == turn.content:
            turn.node = i
            return
