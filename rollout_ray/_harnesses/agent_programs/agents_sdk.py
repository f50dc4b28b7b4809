"""An OpenAI Agents SDK program: one ``Agent`` with a ``bash`` function tool (a command run in
the work directory) and the rollout's tool servers as MCP servers (``MCPServerStreamableHttp``),
its model ``OpenAIResponsesModel`` at the rollout's proxy (Responses), run by ``Runner.run`` on
the task's conversation; prints the final output. The SDK's trace export to OpenAI is switched off.

The task's system prompt joins ``AGENTS_SDK_INSTRUCTIONS`` as the agent's ``instructions``; the
rest of the conversation is its input as Responses items (messages, function calls and their
outputs), so a prior conversation reaches the model as turns, not as text.

Environment: ``AGENTS_SDK`` (the directory the SDK is installed in, put first on ``sys.path``),
``ROLLOUT_AGENT_MODEL``, ``AGENTS_SDK_INSTRUCTIONS``, ``AGENTS_SDK_MAX_TURNS``, and
``ProgramHarness``'s."""

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from typing import Any

import task_prompt

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


def _part(part: dict[str, Any]) -> dict[str, Any]:
    if part.get("type") == "image_url":
        return {"type": "input_image", "image_url": part["image_url"]["url"], "detail": "auto"}
    return {"type": "input_text", "text": str(part.get("text", ""))}


def input_items(turns: list[dict[str, Any]]) -> str | list[Any]:
    """The conversation as ``Runner.run``'s input: one user message as its text, else items."""
    if len(turns) == 1 and turns[0].get("role") == "user":
        return str(task_prompt.text(turns[0].get("content")))
    items: list[Any] = []
    for m in turns:
        content = m.get("content")
        if m.get("role") == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m.get("tool_call_id", ""),
                    "output": task_prompt.text(content),
                }
            )
        elif m.get("role") == "assistant":
            if content:
                items.append({"role": "assistant", "content": task_prompt.text(content)})
            for c in m.get("tool_calls") or ():
                call = {"name": c["function"]["name"], "arguments": c["function"].get("arguments") or "{}"}
                items.append({"type": "function_call", "call_id": c["id"], **call})
        else:  # a user's text and images
            items.append(
                {"role": "user", "content": [_part(p) for p in content] if isinstance(content, list) else content}
            )
    return items


async def main() -> None:
    set_tracing_disabled(True)  # the SDK would otherwise export its traces to OpenAI's servers
    conversation = task_prompt.messages()
    own = os.environ.get("AGENTS_SDK_INSTRUCTIONS") or ""
    instructions = "\n\n".join(s for s in (own, task_prompt.instructions(conversation)) if s)
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
            instructions=instructions or None,
            tools=[bash],
            mcp_servers=servers,
            model=OpenAIResponsesModel(model=os.environ.get("ROLLOUT_AGENT_MODEL", "rollout"), openai_client=client),
        )
        result = await Runner.run(
            agent,
            input_items(task_prompt.turns(conversation)),
            max_turns=int(os.environ.get("AGENTS_SDK_MAX_TURNS", "30")),
        )
        print(result.final_output)
    await client.close()


asyncio.run(main())
