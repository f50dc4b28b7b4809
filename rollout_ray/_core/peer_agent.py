"""A second policy agent in the rollout: a player or a proposer who takes the user's side.

``PeerAgent`` is a ``UserSimulator`` whose model is the policy itself: its calls go through the
rollout's own session, so they are recorded like the rollout agent's (token ids, loss mask,
limits) but on a branch of their own (its own system prompt roots it), and each of its turns
names the node it sampled (``UserTurn.agent_node``). ``_record/agent_branches`` then tells whose
branch is whose and gives each agent its sequences (the trainer batch per agent); a reward
reads each agent's side with ``agent_messages``.

First slice: the rollout's harness must run in process (``ChatHarness``), where the session is
this process's; one peer per rollout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._errors import Refusal, RolloutError, UpstreamError, UserSimulatorError
from .._record.messages import AssistantMessage, Message, Request, SystemMessage, UserMessage, text_of
from .._record.trace import Trace, UserTurn
from .user_sim import UserSimulator

Frame = Callable[[str], str]


def _same(text: str) -> str:
    return text


class PeerAgent(UserSimulator):
    """Another policy agent: it is told the rollout agent's replies and answers them.

    Args:
        system_prompt: the peer's role (it roots the peer's branch).
        name: the peer's name (its turns' ``by``, its batch's key).
        ask: what the peer is told, from the rollout agent's last reply (a game's framing).
        tell: what the rollout agent is told, from the peer's reply.
        done: whether the peer's reply ends the conversation.
    """

    def __init__(
        self,
        system_prompt: str,
        name: str = "peer",
        *,
        ask: Frame = _same,
        tell: Frame = _same,
        done: Callable[[str], bool] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        self.system_prompt, self.ask, self.tell, self.done = system_prompt, ask, tell, done
        self._history: list[Message] = [SystemMessage(system_prompt)]
        self._client: Any = None
        self._trace: Trace | None = None

    def attach(self, trace: Trace, client: Any) -> None:
        if client is None:
            raise UserSimulatorError(
                f"peer agent {self.name!r} needs the rollout's session in process: run "
                "the rollout with an in-process harness (ChatHarness())"
            )
        self._trace, self._client = trace, client

    async def reply(self, dialogue: Sequence[Message]) -> UserTurn:
        replies = [m for m in dialogue if isinstance(m, AssistantMessage) and m.content]
        said = UserMessage(self.ask(text_of(replies[-1].content) if replies else ""))
        try:
            response = await self._client.chat(Request([*self._history, said]))
        except Refusal:  # the rollout stopped (a limit): the game ends with it
            return UserTurn(by=self.name, content="", done=True)
        except (RolloutError, UpstreamError) as e:
            raise UserSimulatorError(f"peer agent {self.name!r}: its model call failed: {e}") from e
        self._history += [said, response.message]
        text = text_of(response.message.content or "")
        done = self.done is not None and self.done(text)
        return UserTurn(by=self.name, content=self.tell(text), done=done, agent_node=self._sampled(response.message))

    def _sampled(self, message: AssistantMessage) -> int | None:
        """The node the session committed for ``message`` (the latest equal sampled one)."""
        nodes = self._trace.nodes if self._trace is not None else []
        for i in range(len(nodes) - 1, -1, -1):
            if nodes[i].sampled and nodes[i].message == message:
                return i
        return None
