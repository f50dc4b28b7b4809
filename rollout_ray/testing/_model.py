"""ScriptedModel: a deterministic model for tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._core.model import Model
from .._record.messages import AssistantMessage, Request, Response, ToolCall, Usage, text_of


@dataclass(frozen=True)
class Reply:
    """One scripted answer.

    Attributes:
        content: the assistant text.
        tool_calls: ``(name, arguments)`` pairs the model asks for.
        usage: token usage; ``None`` counts words, and 10 per tool call (prompt: every
            message of the request; completion: the reply).
        finish_reason: default ``"tool_calls"`` when there are tool calls, else ``"stop"``.
        delay: seconds before answering (virtual under ``run_virtual``).
    """

    content: str | None = None
    tool_calls: Sequence[tuple[str, dict[str, Any]]] = ()
    usage: Usage | None = None
    finish_reason: str | None = None
    delay: float = 0.0


ScriptItem = Reply | str | BaseException | Callable[[Request], "ScriptItem"]


class ScriptedModel(Model):
    """Answers requests from ``script`` in order, then with ``default``.

    A script item is a ``Reply``, a string (a plain reply), an exception instance (raised,
    e.g. ``ProviderError("overloaded", 429)``), or a callable taking the ``Request`` and
    returning one of these. Every request received is kept in ``requests``.
    """

    def __init__(
        self,
        script: Iterable[ScriptItem] = (),
        *,
        default: ScriptItem | None = None,
        name: str = "scripted",
    ) -> None:
        self._script = list(script)
        self._default = default
        self.name = name
        self.requests: list[Request] = []

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Response:
        self.requests.append(request)
        if self._script:
            item: Any = self._script.pop(0)
        elif self._default is not None:
            item = self._default
        else:
            raise RuntimeError(f"ScriptedModel: script exhausted after {len(self.requests) - 1} requests")
        while callable(item) and not isinstance(item, BaseException):
            item = item(request)
        if isinstance(item, BaseException):
            raise item
        reply = Reply(content=item) if isinstance(item, str) else item
        if reply.delay:
            await asyncio.sleep(reply.delay)
        return _response(request, reply, model)


def _response(request: Request, reply: Reply, model: str | None) -> Response:
    calls = [
        ToolCall(id=f"call_{len(request.messages)}_{i}", name=name, arguments=json.dumps(args))
        for i, (name, args) in enumerate(reply.tool_calls)
    ]
    usage = reply.usage or Usage(
        prompt_tokens=sum(_words(m) for m in request.messages),
        completion_tokens=len((reply.content or "").split()) + 10 * len(calls),
    )
    finish = reply.finish_reason or ("tool_calls" if calls else "stop")
    message = AssistantMessage(content=reply.content, tool_calls=calls or None)
    return Response(message=message, finish_reason=finish, usage=usage, model=model)  # type: ignore[arg-type]


def _words(message: Any) -> int:
    calls = getattr(message, "tool_calls", None) or ()
    return len(text_of(getattr(message, "content", "")).split()) + 10 * len(calls)
