"""A two-player counting game: two policy agents in one rollout, each rewarded for its moves.

Player A is the rollout's agent; player B is a ``PeerAgent`` whose calls go through the same
model boundary on a branch of its own. The game frames each move for the other player. Each
agent's side is ``agent_messages(trace, name)``, its training sequences
``agent_sequences(trace)[name]``, its reward ``agent_rewards(trace)[name]`` (the stored run's
``agent_rewards`` column) and its trainer batch ``Group.batch_by_agent()[name]``.

    rollout-ray eval examples/two_player.py           # built-in simulated model, local Ray
"""

from __future__ import annotations

import random

from rollout_ray import (
    AssistantMessage,
    ChatHarness,
    EvalConfig,
    PeerAgent,
    Task,
    TaskData,
    Trace,
    agent_messages,
    reward,
)


class CountData(TaskData):
    start: int
    step: int


class Count(Task):
    """Players take turns adding ``step`` to the last number said; A opens from ``start``."""

    data_type = CountData

    def user_simulator(self) -> PeerAgent:
        step = self.data.step  # type: ignore[attr-defined]

        def move(said: str) -> str:
            return f"Your opponent said {said}. What is {said} + {step}?"

        return PeerAgent(
            "You are player B. Answer with the number only.", name="player_b", ask=move, tell=move, max_turns=2
        )

    @reward
    def player_a(self, task: CountData, trace: Trace) -> float:
        return float(_moves(trace, None) == [str(task.start + k * task.step) for k in (1, 3, 5)])

    @reward(agent="player_b")  # player B's own reward: its column in agent_rewards, its batch's advantage
    def player_b(self, task: CountData, trace: Trace) -> float:
        return float(_moves(trace, "player_b") == [str(task.start + k * task.step) for k in (2, 4)])


def _moves(trace: Trace, agent: str | None) -> list[str]:
    return [text_of(m.content).strip() for m in agent_messages(trace, agent) if isinstance(m, AssistantMessage)]


def tasks(n: int = 20, seed: int = 4) -> list[Count]:
    rng = random.Random(seed)
    out = []
    for idx in range(n):
        start, step = rng.randint(1, 50), rng.randint(2, 9)
        out.append(
            Count(
                {
                    "idx": idx,
                    "start": start,
                    "step": step,
                    "prompt": f"We count up by {step} from {start}. What is {start} + {step}?",
                    "system_prompt": "You are player A. Answer with the number only.",
                }
            )
        )
    return out


def harness() -> ChatHarness:
    return ChatHarness()


config = EvalConfig(samples_per_task=2, max_in_flight=32)


def text_of(content: object) -> str:
    """A message's text (chat content is a string, or a list of parts)."""
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") for part in content or ())  # type: ignore[attr-defined]
