"""An OpenAI Agents SDK program: one ``Agent`` with a ``bash`` function tool (a command run in
the work directory) and the rollout's tool servers as MCP servers (``MCPServerStreamableHttp``),
its model ``OpenAIResponsesModel`` at the rollout's proxy (Responses), run by ``Runner.run`` on
the task's prompt; prints the final output. The SDK's trace export to OpenAI is switched off.

Environment: ``AGENTS_SDK`` (the directory the SDK is installed in, put first on ``sys.path``),
``ROLLOUT_AGENT_MODEL``, ``AGENTS_SDK_INSTRUCTIONS``, ``AGENTS_SDK_MAX_TURNS``, and
``ProgramHarness``'s."""

import asyncio
import contextlib
import json
import os
import subprocess
import sys

sys.path.insert(0, os.environ["AGENTS_SDK"])

from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from agents.mcp import MCPServerStreamableHttp
from openai import AsyncOpenAI


@function_tool
def bash(command: str) -> str:
    """Run a bash command in the working directory; its exit code, stdout and stderr."""
    # S603/S607: running the model's command is this tool's job; it runs inside the rollout's sandbox
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)  # noqa: S603, S607
    return f"exit code {done.returncode}\n{done.stdout}{done.stderr}"


async def main() -> None:
    set_tracing_disabled(True)  # the SDK would otherwise export its traces to OpenAI's servers
    with open(os.environ["ROLLOUT_RAY_INPUT"]) as f:  # noqa: ASYNC230 - one small file before anything runs
        prompt = next(str(m["content"]) for m in json.load(f)["messages"] if m["role"] == "user")
    mcp = json.loads(os.environ.get("ROLLOUT_RAY_MCP") or "{}").get("mcpServers", {})
    client = AsyncOpenAI(max_retries=0)
    async with contextlib.AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(
                MCPServerStreamableHttp({"url": s["url"]}, name=name, cache_tools_list=True)
            )
            for name, s in mcp.items()
        ]
        agent = Agent(
            name="agent",
            instructions=os.environ.get("AGENTS_SDK_INSTRUCTIONS") or None,
            tools=[bash],
            mcp_servers=servers,
            model=OpenAIResponsesModel(model=os.environ.get("ROLLOUT_AGENT_MODEL", "rollout"), openai_client=client),
        )
        result = await Runner.run(agent, prompt, max_turns=int(os.environ.get("AGENTS_SDK_MAX_TURNS", "30")))
        print(result.final_output)
    await client.close()


asyncio.run(main())
