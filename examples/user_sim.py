"""A tau-style airline task: a scripted customer talks to the agent until it has its quote.

The agent is the policy (the built-in simulated model by default); the customer is the task's
simulated user (``Task.user_simulator``), here a script that reacts to what the agent said. Its
turns are on ``trace.user_turns`` (who said them, which graph node the agent received), apart
from the policy's calls; the reward reads the whole dialogue.

    rollout-ray eval examples/user_sim.py              # built-in simulated model, local Ray
    rollout-ray view <run dir>                          # the dialogue, turn by turn

A simulator with a model of its own is ``ModelUser(OpenAIModel(url), system_prompt)``: a
reply containing ``###STOP###`` ends the conversation.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from rollout_ray import (
    AssistantMessage,
    ChatHarness,
    EvalConfig,
    Message,
    ScriptedUser,
    Task,
    TaskData,
    Trace,
    metric,
    reward,
)


class ChangeData(TaskData):
    change_fee: int
    fare_difference: int
    bag_fee: int


class FlightChange(Task):
    """The customer changes a flight and adds a bag; the agent must quote both totals."""

    data_type = ChangeData

    def user_simulator(self) -> ScriptedUser:
        data: ChangeData = self.data  # type: ignore[assignment]
        change = data.change_fee + data.fare_difference

        def bag(dialogue: Sequence[Message]) -> str | None:
            # A customer who got a wrong quote says so and leaves: the dialogue shows whose fault.
            if _last_reply(dialogue) != str(change):
                return None
            return f"OK. And with a checked bag on top, what is {change} + {data.bag_fee}?"

        return ScriptedUser([bag], name="customer", max_turns=3)

    @reward
    def quoted(self, task: ChangeData, trace: Trace) -> float:
        """Both totals quoted, each right after the customer's question."""
        change = task.change_fee + task.fare_difference
        replies = [text_of(m.content).strip() for m in trace.messages if isinstance(m, AssistantMessage)]
        return float(replies == [str(change), str(change + task.bag_fee)])

    @metric
    def customer_turns(self, trace: Trace) -> float:
        return sum(1 for t in trace.user_turns if not t.done)


def _last_reply(dialogue: Sequence[Message]) -> str:
    replies = [m for m in dialogue if isinstance(m, AssistantMessage)]
    return text_of(replies[-1].content).strip() if replies else ""


def tasks(n: int = 20, seed: int = 3) -> list[FlightChange]:
    rng = random.Random(seed)
    out = []
    for idx in range(n):
        fee, diff, bag = rng.randint(50, 99), rng.randint(100, 400), rng.randint(30, 60)
        prompt = (
            f"Hi, I'm on flight UA{100 + idx} and want the 6pm one instead. The change fee is {fee} "
            f"and the fare difference is {diff}: what is {fee} + {diff}?"
        )
        out.append(
            FlightChange(
                {
                    "idx": idx,
                    "prompt": prompt,
                    "change_fee": fee,
                    "fare_difference": diff,
                    "bag_fee": bag,
                    "system_prompt": "You are an airline agent. Answer with the total only.",
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
