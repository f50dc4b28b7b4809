"""A task's simulated user: it answers the policy's turns until it ends the conversation; its
turns are user turns with who said them, its model calls are kept apart from the policy's."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from rollout_ray import (
    ChatHarness,
    Message,
    ModelUser,
    RolloutLimits,
    ScriptedUser,
    Task,
    Trace,
    UserMessage,
    UserSimulator,
    UserSimulatorError,
    UserTurn,
    reward,
)
from rollout_ray._record.messages import text_of
from rollout_ray._record.tokens import token_sequences
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer
from rollout_ray.testing import MemoryRuntime, Reply, ScriptedHarness, ScriptedModel

from conftest import make_rollout, run


class Booking(Task):
    """The user wants flight ABC123 moved; rewarded when the agent said it moved it."""

    user: Any = None

    def user_simulator(self) -> Any:
        return type(self).user()

    @reward
    def moved(self, trace: Trace) -> float:
        said = [text_of(m.content) for m in trace.messages]
        return float("ABC123" in " ".join(said) and trace.last_reply == "moved ABC123")


def booking(user: Any, prompt: str | None = "Hello, how can I help?") -> Booking:
    task = Booking({"prompt": prompt})
    type(task).user = staticmethod(user)
    return task


def test_a_scripted_user_answers_until_its_script_ends_and_the_reward_sees_the_dialogue() -> None:
    policy = ScriptedModel(["Which booking?", "moved ABC123", "moved ABC123"])
    task = booking(lambda: ScriptedUser(["Move my flight please", "It is ABC123"]))
    trace = run(make_rollout(task, model=policy).run())
    assert trace.ok and trace.stop_condition == "agent_completed"
    assert [(type(m).__name__, text_of(m.content)) for m in trace.messages] == [
        ("UserMessage", "Hello, how can I help?"),
        ("AssistantMessage", "Which booking?"),
        ("UserMessage", "Move my flight please"),
        ("AssistantMessage", "moved ABC123"),
        ("UserMessage", "It is ABC123"),
        ("AssistantMessage", "moved ABC123"),
    ]
    spoken = [t for t in trace.user_turns if not t.done]
    assert [t.by for t in trace.user_turns] == ["scripted_user"] * 3 and trace.user_turns[-1].done
    assert [trace.nodes[t.node].message for t in spoken] == [UserMessage(t.content) for t in spoken]  # type: ignore[index]
    assert trace.num_turns == len(trace.calls) == 3 and trace.rewards["moved"] is not None
    assert trace.reward == 1.0


def test_a_user_can_open_a_prompt_less_task_and_a_rule_can_end_it() -> None:
    def until_moved(dialogue: Sequence[Message]) -> str | None:
        return None if "moved" in text_of(dialogue[-1].content or "") else "and ABC123?"

    task = booking(lambda: ScriptedUser(["Move my flight", until_moved, until_moved, until_moved]), prompt=None)
    trace = run(make_rollout(task, model=ScriptedModel(["Which one?", "moved ABC123"])).run())
    assert trace.ok and [t.content for t in trace.user_turns] == ["Move my flight", "and ABC123?", ""]
    assert trace.user_turns[0].node == 0 and trace.num_turns == 2


def test_the_users_turns_are_bounded_by_its_max_turns() -> None:
    task = booking(lambda: ScriptedUser(["again"] * 50, max_turns=3))
    trace = run(make_rollout(task, model=ScriptedModel(default="ok")).run())
    assert trace.ok and len(trace.user_turns) == 3 and trace.num_turns == 4


def test_the_users_model_calls_are_outside_the_policys_calls_and_token_limits() -> None:
    # The simulator's calls are 1,000 tokens each: counted against the agent they would stop it.
    big = ScriptedModel(default=Reply("Please move ABC123", usage=_usage(1000)))
    task = booking(lambda: ModelUser(big, "You are a customer who wants flight ABC123 moved.", max_turns=2))
    rollout = make_rollout(
        task,
        model=ScriptedModel(default=Reply("moved ABC123", usage=_usage(10))),
        limits=RolloutLimits(max_total_tokens=100),
    )
    trace = run(rollout.run())
    assert trace.ok and trace.stop_condition == "agent_completed"
    assert len(trace.calls) == trace.num_turns == 3
    assert [t.call.usage.total_tokens for t in trace.user_turns] == [1000, 1000]  # type: ignore[union-attr]
    # The simulator saw the dialogue with the roles swapped under its own prompt, not the task's.
    assert [(m.role, text_of(m.content)) for m in big.requests[1].messages] == [
        ("system", "You are a customer who wants flight ABC123 moved."),
        ("user", "moved ABC123"),
        ("assistant", "Please move ABC123"),
        ("user", "moved ABC123"),
    ]


def test_a_model_user_ends_the_conversation_with_its_stop_marker() -> None:
    user_model = ScriptedModel(["It is ABC123", "Thanks! ###STOP###"])
    task = booking(lambda: ModelUser(user_model, "You are a customer."))
    trace = run(make_rollout(task, model=ScriptedModel(default="moved ABC123")).run())
    assert trace.ok and [(t.content, t.done) for t in trace.user_turns] == [("It is ABC123", False), ("Thanks!", True)]
    assert trace.user_turns[-1].node is None and trace.num_turns == 2


class Broken(UserSimulator):
    def __init__(self, hang: bool) -> None:
        super().__init__("broken", timeout=5.0)
        self.hang = hang

    async def reply(self, dialogue: Sequence[Message]) -> UserTurn:
        if self.hang:
            await asyncio.Event().wait()
        raise KeyError("no such customer")


def test_a_failing_or_hanging_user_fails_the_rollout_with_its_own_error() -> None:
    for hang, says in ((False, "raised KeyError"), (True, "did not reply within 5s")):
        trace = run(make_rollout(booking(lambda hang=hang: Broken(hang))).run())
        assert not trace.ok and trace.last_error is not None
        assert trace.last_error.is_a(UserSimulatorError) and says in trace.last_error.message
        assert trace.num_turns == 1  # the policy's turn before it is kept


def test_served_the_loss_mask_holds_only_the_policys_tokens() -> None:
    """Policy and user on the simulated server over HTTP: the user's turns are prompt ids of the
    policy's sequence (mask 0), its calls are not the policy's."""

    async def main() -> Trace:
        async with SimulatedModelServer(SimulatedModelConfig(ttft=0, dialect="vllm")) as server:
            policy = OpenAIModel(server.base_url, name="simulated", token_capture="vllm")
            user = OpenAIModel(server.base_url, name="simulated")
            task = booking(lambda: ModelUser(user, "You are a customer.", max_turns=2))
            try:
                rollout = make_rollout(task, model=policy, harness=ChatHarness(), runtime_factory=MemoryRuntime)
                return await asyncio.wait_for(rollout.run(), 60)
            finally:
                await policy.aclose()

    trace = asyncio.run(main())
    assert trace.ok and trace.num_turns == len(trace.calls) == 3 and len(trace.user_turns) == 2
    assert all(t.call is not None and t.call.usage is not None for t in trace.user_turns)
    [sequence] = token_sequences(trace)
    completions = [trace.nodes[c.node].token_ids for c in trace.calls]  # type: ignore[index]
    assert sum(sequence.loss_mask) == sum(len(c or ()) for c in completions)


def _usage(total: int) -> Any:
    from rollout_ray import Usage

    return Usage(prompt_tokens=total // 2, completion_tokens=total - total // 2)


def test_a_harness_that_cannot_resume_is_refused_before_the_agent_runs() -> None:
    class OneShot(ScriptedHarness):
        supports_resume = False

    policy = ScriptedModel(default="moved ABC123")
    trace = run(make_rollout(booking(lambda: ScriptedUser(["again"])), model=policy, harness=OneShot()).run())
    assert trace.last_error is not None and trace.last_error.is_a(UserSimulatorError)
    assert "harness 'scripted' cannot resume a conversation" in trace.last_error.message
    assert policy.requests == []  # refused at open: no model call was spent
