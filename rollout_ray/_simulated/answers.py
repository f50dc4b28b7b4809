"""The simulated model's policy: what it answers, and how many tokens that costs.

Pure functions, no I/O. The policy answers integer arithmetic (``+ - *``, unary minus,
parentheses) found in the last user message, calls a calculator tool when one is offered,
reports a tool's result once it is back, follows a task's scripted plan (``plans.py``),
and otherwise says ``"I don't know."``. Its answers are wrong (one too high) with the probability ``completion.py`` draws against. The token
counts here are the estimate used when no token capture is asked for (four characters a
token); with token capture, ``completion.py`` counts the tokenizer's ids instead.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from typing import Any

from .config import SimulatedModelConfig
from .plans import follow
from .template import text_of

UNKNOWN = "I don't know."
CALCULATOR_HINTS = ("calc", "add", "eval")
MAX_EXPRESSION_CHARS = 200
# Bounds the work a hostile prompt can cause (e.g. a long chain of multiplications).
MAX_MAGNITUDE = 10**64

_CANDIDATE = re.compile(r"[0-9 \t()+\-*]+")
_INTEGER = re.compile(r"-?[0-9]{1,64}")
_BINOPS: dict[type[ast.operator], Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
}


def evaluate(expression: str) -> int:
    """The value of an integer ``+ - *`` expression; ``ValueError`` for anything else.

    The expression is parsed with ``ast`` and only int literals, ``+ - *``, unary ``-`` and
    parentheses are walked: nothing is ever executed.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError("expression too long")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(f"not an expression: {expression!r}") from exc
    return _walk(tree.body)


def _walk(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        value = node.value
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        value = _BINOPS[type(node.op)](_walk(node.left), _walk(node.right))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = -_walk(node.operand)
    else:
        raise ValueError(f"disallowed syntax: {type(node).__name__}")
    if abs(value) > MAX_MAGNITUDE:
        raise ValueError("value too large")
    return value


def _balance(candidate: str) -> str:
    """Drop unmatched parentheses at the edges: ``"(what is 3+4)"`` yields ``"3+4)"``."""
    text = candidate.strip()
    while text.count("(") > text.count(")") and text.startswith("("):
        text = text[1:].strip()
    while text.count(")") > text.count("(") and text.endswith(")"):
        text = text[:-1].strip()
    return text


def find_expression(text: str) -> tuple[str, int] | None:
    """The longest arithmetic expression in ``text`` that has an operator, and its value."""
    best: tuple[str, int] | None = None
    for match in _CANDIDATE.finditer(text):
        candidate = _balance(match.group())
        if not any(c.isdigit() for c in candidate) or not any(c in "+-*" for c in candidate):
            continue
        try:
            value = evaluate(candidate)
        except ValueError:
            continue
        if best is None or len(candidate) > len(best[0]):
            best = (candidate, value)
    return best


def _tool_calls(message: dict[str, Any]) -> list[Any]:
    calls = message.get("tool_calls")
    return calls if isinstance(calls, list) else []


def _calculator(tools: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str) and any(h in name.lower() for h in CALCULATOR_HINTS):
            return fn  # type: ignore[no-any-return]
    return None


def _arguments(fn: dict[str, Any], expression: str) -> str:
    params = fn.get("parameters")
    props = params.get("properties") if isinstance(params, dict) else None
    if isinstance(props, dict) and "a" in props and "b" in props:
        node = ast.parse(expression, mode="eval").body
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            try:
                # Only literal operands (possibly negated) make a single binary "+".
                a, b = ast.literal_eval(node.left), ast.literal_eval(node.right)
            except (ValueError, TypeError):
                a = b = None
            if type(a) is int and type(b) is int:
                return json.dumps({"a": a, "b": b})
    return json.dumps({"expression": expression})


def _unwrapped(result: str) -> str:
    """A tool's result as an agent passes it on, unwrapped: Codex frames it (``Wall time: ...``
    then ``Output:`` and the output), and an MCP tool's non-object result may come as its
    ``structuredContent`` wrapping ``{"result": value}`` (Claude Code and Codex send that, not
    the text), which is the value."""
    head, framed, output = result.rpartition("\nOutput:\n")
    if framed and head.startswith("Wall time:"):
        result = output.strip()
    if not result.startswith('{"result"'):
        return result
    try:
        data = json.loads(result)
    except ValueError:
        return result
    if isinstance(data, dict) and len(data) == 1 and not isinstance(data["result"], (dict, list)):
        return str(data["result"])
    return result


def respond(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    config: SimulatedModelConfig,
    rng_value: float,
    error_rate: float | None = None,
) -> dict[str, Any]:
    """The assistant message answering ``messages``; deterministic in its arguments.

    A tool message after the last user message is answered with its content, stripped. Else
    arithmetic in the last user message gets a tool call (``id`` ``call_<n>``, ``n`` = tool
    calls so far) if a calculator tool is offered, or its value as text. An integer answer,
    its own or a tool's, is one too high when ``rng_value < error_rate`` (default
    ``config.error_rate``): the model misreads a result as it miscomputes one. Anything else
    gets ``"I don't know."``. A scripted plan in the conversation (``plans.py``) comes first:
    its next step, never wrong (it drives an agent program, it is not graded).
    """
    planned = follow(messages, tools)
    if planned is not None:
        return planned
    wrong = rng_value < (config.error_rate if error_rate is None else error_rate)
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if last_user is None:
        return {"role": "assistant", "content": UNKNOWN}
    results = [m for m in messages[last_user + 1 :] if m.get("role") == "tool"]
    if results:
        result = _unwrapped(text_of(results[-1].get("content")).strip())
        if wrong and _INTEGER.fullmatch(result):
            result = str(int(result) + 1)
        return {"role": "assistant", "content": result}
    found = find_expression(text_of(messages[last_user].get("content")))
    if found is None:
        return {"role": "assistant", "content": UNKNOWN}
    expression, value = found
    fn = _calculator(tools)
    if fn is not None:
        n = sum(len(_tool_calls(m)) for m in messages)
        call = {
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": fn["name"], "arguments": _arguments(fn, expression)},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"role": "assistant", "content": str(value + 1 if wrong else value)}


def estimate_tokens(text: str) -> int:
    """A cheap, deterministic token count: four characters a token."""
    return len(text) // 4


def message_text(message: dict[str, Any]) -> str:
    """Everything in a message that costs tokens: content, tool names and arguments."""
    parts = [text_of(message.get("content"))]
    for call in _tool_calls(message):
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            parts.append(str(fn.get("name", "")) + str(fn.get("arguments", "")))
    return "".join(parts)


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """``len(text) // 4 + 4`` per message (the 4 stands for role and framing)."""
    return sum(estimate_tokens(message_text(m)) + 4 for m in messages)


def cap_completion(message: dict[str, Any], cap: int) -> tuple[dict[str, Any], str, int]:
    """``(message, finish_reason, completion_tokens)`` with text truncated to ``cap`` tokens.

    Completion tokens are ``max(1, len(text) // 4)``. Only plain text is capped (finish
    reason ``"length"``); tool calls always finish with ``"tool_calls"``.
    """
    tokens = max(1, estimate_tokens(message_text(message)))
    if _tool_calls(message):
        return message, "tool_calls", tokens
    if tokens <= cap:
        return message, "stop", tokens
    return {**message, "content": message["content"][: cap * 4]}, "length", cap
