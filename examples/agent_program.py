"""A minimal tool-calling agent for ``ProgramHarness``: Python standard library only.

Reads the conversation from ``ROLLOUT_RAY_INPUT``, the tool servers from
``ROLLOUT_RAY_TOOLS`` and the model endpoint from ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``;
chats until the model answers without tool calls, prints that answer and exits 0. Any HTTP
error of the model or a tool server is printed to stderr and the program exits 1 (after a
``rollout stopped: ...`` refusal, the rollout treats that exit as clean).

    ProgramHarness([sys.executable, "examples/agent_program.py"])
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

MAX_CALLS = int(os.environ.get("AGENT_MAX_CALLS", "32"))
TIMEOUT = float(os.environ.get("AGENT_REQUEST_TIMEOUT", "600"))


# The endpoint and the tool servers are the rollout's own, usually on loopback: never proxied.
LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))
DEFAULT = urllib.request.build_opener()


class AgentError(Exception):
    def __init__(self, message: str, code: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.code, self.detail = code, detail


def request(url: str, body: Any = None, token: str | None = None) -> Any:
    """GET (no body) or POST JSON; the decoded JSON answer. HTTP errors raise AgentError."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    host = urllib.parse.urlsplit(url).hostname
    opener = LOOPBACK if host in ("127.0.0.1", "localhost", "::1") else DEFAULT
    try:
        with opener.open(urllib.request.Request(url, data=data, headers=headers), timeout=TIMEOUT) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        detail = error_text(e.read())
        raise AgentError(f"{url} answered {e.code}: {detail}", e.code, detail) from None
    except urllib.error.URLError as e:
        raise AgentError(f"{url} unreachable: {e.reason}") from None


def error_text(raw: bytes) -> str:
    try:
        error = json.loads(raw)["error"]
        return str(error["message"] if isinstance(error, dict) else error)
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", errors="replace")


def load_tools(urls: dict[str, str]) -> tuple[list[Any], dict[str, str]]:
    specs: list[Any] = []
    owners: dict[str, str] = {}
    for url in urls.values():
        for spec in request(url)["tools"]:
            owners[spec["function"]["name"]] = url
            specs.append(spec)
    return specs, owners


def call_tool(owners: dict[str, str], call: dict[str, Any]) -> str:
    name = call["function"]["name"]
    url = owners.get(name)
    if url is None:
        return f"error: unknown tool {name!r}"
    body = {"name": name, "arguments": call["function"].get("arguments") or "{}"}
    try:
        return str(request(f"{url}/call", body)["content"])
    except AgentError as e:
        if e.code in (400, 404):  # bad arguments or unknown tool: the model may correct itself
            return f"error: {e.detail}"
        raise


def main() -> int:
    with open(os.environ["ROLLOUT_RAY_INPUT"], encoding="utf-8") as f:
        messages = json.load(f)["messages"]
    base, key = os.environ["OPENAI_BASE_URL"].rstrip("/"), os.environ.get("OPENAI_API_KEY", "")
    try:
        specs, owners = load_tools(json.loads(os.environ.get("ROLLOUT_RAY_TOOLS") or "{}"))
        answer = ""
        for _ in range(MAX_CALLS):
            body: dict[str, Any] = {"messages": messages}
            if specs:
                body["tools"] = specs
            message = request(f"{base}/chat/completions", body, key)["choices"][0]["message"]
            message["role"] = "assistant"
            messages.append(message)
            answer = message.get("content") or ""
            if not message.get("tool_calls"):
                break
            for call in message["tool_calls"]:
                content = call_tool(owners, call)
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": content, "name": call["function"]["name"]}
                )
    except AgentError as e:
        print(e, file=sys.stderr)
        return 1
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
