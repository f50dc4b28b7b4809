"""An agent that never stops on its own: it asks the model again after every answer, until a
budget refuses the call (issue 21 §6: the CLI's defaults must end it)."""

from rollout_ray import ChatHarness, ProgramResult, Request, Task, UserMessage


class Asks(Task):
    pass


class NeverStops(ChatHarness):
    async def launch(self, ctx):
        messages = [UserMessage(ctx.data.prompt)]
        while True:
            try:
                reply = await ctx.client.chat(Request(list(messages)))
            except Exception as e:  # noqa: BLE001 - a budget refused the call: the only way out
                return ProgramResult(1, stderr=str(e))
            messages += [reply.message, UserMessage("and again?")]


def tasks():
    return [Asks({"prompt": "What is 1 + 1?"})]


def harness():
    return NeverStops()
