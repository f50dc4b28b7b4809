"""Toolsets: typed methods that become tools the model can call (§5.5).

``@tool`` methods of a ``Toolset`` become functions with a JSON schema built from their type
hints; a parameter named ``runtime`` is hidden from the model and gets the rollout's Runtime.
The ``ToolServer`` (``_serving/tool_server``) serves them over HTTP.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec
import pydantic
import pydantic_core

from .._errors import ToolInputError, ToolsetError
from .._record.messages import Tool
from .runtime import Runtime

log = logging.getLogger("rollout_ray")

_MARK = "__rollout_ray_tool__"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
DEFAULT_CALL_TIMEOUT = 60.0
_CONFIG = pydantic.ConfigDict(extra="forbid", protected_namespaces=(), arbitrary_types_allowed=True)


def tool(fn: Any = None, /, *, name: str | None = None) -> Any:
    """Mark a ``Toolset`` method as a tool, named ``name`` or after the method."""

    def mark(f: Any) -> Any:
        setattr(f, _MARK, name or f.__name__)
        return f

    return mark(fn) if fn is not None else mark


@dataclass(frozen=True)
class _ToolDef:
    attr: str
    spec: Tool
    model: type[pydantic.BaseModel]  # field `p_<name>` per offered parameter
    wants_runtime: bool


def _clean(node: Any) -> Any:
    """Drop pydantic's generated ``title``s; literal values (defaults, enums) are kept as is."""
    if isinstance(node, list):
        return [_clean(v) for v in node]
    if not isinstance(node, dict):
        return node
    literal = ("default", "const", "enum", "examples")
    return {k: v if k in literal else _clean(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))}


def _build(cls: type, attr: str, fn: Callable[..., Any], name: str) -> _ToolDef:
    where = f"tool {cls.__name__}.{attr}"
    if not _NAME.match(name):
        raise ToolsetError(f"{where}: name {name!r} must match {_NAME.pattern}")
    hints = _hints(fn, where)
    fields: dict[str, Any] = {}
    parameters = list(inspect.signature(fn).parameters.values())[1:]  # skip self
    for p in parameters:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ToolsetError(f"{where}: *args / **kwargs are not supported")
        if p.name != "runtime":
            default = ... if p.default is p.empty else p.default
            # Aliased fields: names like `schema` or `model_x` never clash with BaseModel's.
            fields[f"p_{p.name}"] = (hints.get(p.name, Any), pydantic.Field(default, alias=p.name))
    model = pydantic.create_model(f"{cls.__name__}_{name}", __config__=_CONFIG, **fields)
    schema = {"properties": {}, "required": [], **_clean(model.model_json_schema())}
    doc = " ".join((inspect.getdoc(fn) or "").split("\n\n")[0].split())
    return _ToolDef(attr, Tool(name, doc, schema), model, any(p.name == "runtime" for p in parameters))


def _hints(fn: Callable[..., Any], where: str) -> dict[str, Any]:
    """Resolved annotations of every parameter but ``runtime``.

    ``runtime`` is injected by name, so its annotation is never evaluated: it may name a type
    its module cannot see (e.g. in a class shipped by value to a Ray worker).
    """
    raw = inspect.get_annotations(fn)
    hints = {}
    for name, annotation in raw.items():
        if name in ("runtime", "return"):
            continue
        try:
            hints[name] = typing.get_type_hints(_Probe(annotation, fn), include_extras=True)["x"]
        except Exception as e:
            raise ToolsetError(f"{where}: cannot resolve the type of {name!r}: {e}") from e
    return hints


class _Probe:
    """A stand-in carrying one annotation and ``fn``'s globals, for ``get_type_hints``."""

    def __init__(self, annotation: Any, fn: Callable[..., Any]) -> None:
        self.__annotations__ = {"x": annotation}
        self.__globals__ = getattr(fn, "__globals__", {})
        self.__module__ = getattr(fn, "__module__", None) or __name__


class Toolset:
    """A tool server's worth of ``@tool`` methods.

    ``name`` (class attribute, default: the class name in snake case) is the server name.
    Sync tools run in a worker thread, so a slow one never blocks the server's other calls
    (one that outlives its call timeout runs on to completion: threads cannot be killed).
    """

    name: ClassVar[str] = "toolset"
    call_timeout: ClassVar[float | None] = None
    """Seconds one call of these tools may run before it is answered as an error; ``None``:
    the server's (``DEFAULT_CALL_TIMEOUT``). A tool that waits on something outside (a
    service that never answers) fails that call, not the rollout."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            snake = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", cls.__name__)
            cls.name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", snake).lower()

    def wants_runtime(self) -> bool:
        """True when some tool takes the rollout's ``runtime``."""
        return any(d.wants_runtime for d in self._tools().values())

    @classmethod
    def _tools(cls) -> dict[str, _ToolDef]:
        table = cls.__dict__.get("_rr_tools")
        if table is None:
            members: dict[str, Any] = {}
            for klass in reversed(cls.__mro__):
                members.update(vars(klass))
            table = {}
            for attr, obj in members.items():
                name = getattr(obj, _MARK, None)
                if name is not None and callable(obj):
                    if name in table:
                        raise ToolsetError(f"{cls.__name__} defines tool {name!r} twice")
                    table[name] = _build(cls, attr, obj, name)
            cls._rr_tools = table  # type: ignore[attr-defined]
        return table

    async def _open_tools(self, runtime: Runtime | None) -> None:
        """Reach what the tools need before ``specs`` is asked (``tools.open_toolsets``): a
        native toolset has nothing to reach; an MCP toolset lists its server's tools here."""

    async def _close_tools(self) -> None:
        """Let go of what ``_open_tools`` reached (an MCP toolset's stdio server)."""

    def specs(self) -> list[Tool]:
        """The tools, in definition order. Raises ``ToolsetError`` for an unusable signature."""
        return [t.spec for t in self._tools().values()]

    def _bind(self, name: str, arguments: Any, runtime: Runtime | None) -> tuple[Any, dict[str, Any]]:
        tool_def = self._tools().get(name)
        if tool_def is None:
            raise ToolInputError(f"unknown tool {name!r} in tool server {self.name!r}", 404)
        try:
            valid = tool_def.model.model_validate(arguments)
        except pydantic.ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(map(str, err['loc'])) or '<arguments>'}: {err['msg']}" for err in e.errors()
            )
            raise ToolInputError(f"invalid arguments for tool {name!r}: {problems}", 400) from None
        kwargs = {f[2:]: getattr(valid, f) for f in type(valid).model_fields}
        if tool_def.wants_runtime:
            kwargs["runtime"] = runtime
        return getattr(self, tool_def.attr), kwargs

    async def call(self, name: str, arguments: dict[str, Any], runtime: Runtime | None = None) -> str:
        """Validate ``arguments``, run tool ``name``; its result as text (str as is, else JSON).

        Raises ``ToolInputError`` for an unknown tool or bad arguments, else what the tool raised.
        """
        fn, kwargs = self._bind(name, arguments, runtime)
        return _text(await _invoke(fn, kwargs))


async def _invoke(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(**kwargs)
    result = await asyncio.to_thread(fn, **kwargs)
    return await result if inspect.isawaitable(result) else result


def _text(result: Any) -> str:
    if isinstance(result, str):
        return result
    hook = lambda obj: pydantic_core.to_jsonable_python(obj, fallback=str)  # noqa: E731
    return msgspec.json.encode(result, enc_hook=hook).decode()
