"""An OpenAI Agents SDK program with one function tool, run unchanged as a ProgramHarness
agent: the SDK reads OPENAI_BASE_URL / OPENAI_API_KEY and speaks Responses to the proxy.
Run with ``python -W error`` so any warning of the SDK's fails it."""

import asyncio
import json
import os
import re

from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI


@function_tool
def calculator(expression: str) -> str:
    """Evaluate a product of two integers, such as 17*3."""
    a, b = map(int, re.fullmatch(r"\s*(\d+)\s*\*\s*(\d+)\s*", expression).groups())
    return str(a * b)


async def main() -> None:
    set_tracing_disabled(True)  # the SDK would otherwise export its traces to OpenAI's servers
    with open(os.environ["ROLLOUT_RAY_INPUT"]) as f:
        messages = json.load(f)["messages"]
    prompt = next(m["content"] for m in messages if m["role"] == "user")
    client = AsyncOpenAI(max_retries=0)
    agent = Agent(
        name="calc",
        instructions="Use the calculator.",
        tools=[calculator],
        model=OpenAIResponsesModel(model="simulated", openai_client=client),
    )
    result = await Runner.run(agent, prompt)
    print(result.final_output)
    await client.close()


asyncio.run(main())
