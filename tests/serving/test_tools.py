"""Toolsets (schemas, validation, calls) and the ToolServer (capability URLs, records, limits)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import msgspec
import pytest

from rollout_ray import Runtime, Tool, ToolCallRecord, ToolsetError
from rollout_ray._core.toolset import Toolset, tool
from rollout_ray._errors import ToolInputError
from rollout_ray._serving.tool_server import ToolServer


class MathTools(Toolset):
    @tool
    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Long explanation that is not part of the description.
        """
        return a + b

    @tool(name="scale")
    async def scale_all(
        self, xs: list[float], factor: float = 2.0, label: str | None = None, tags: list[str] | None = None
    ) -> dict[str, Any]:
        """Multiply every number
        by a factor."""
        return {"xs": [x * factor for x in xs], "label": label, "tags": tags}

    @tool
    async def fail(self, reason: str) -> str:
        raise ValueError(reason)

    @tool
    async def wait(self) -> str:
        await asyncio.Event().wait()
        return "never"

    @tool
    async def where(self, runtime: Runtime, path: str = ".") -> str:
        return f"{runtime} {path}"

    def not_a_tool(self) -> None:
        """Undecorated methods are not offered."""


class Counter(Toolset):
    name = "counter"

    def __init__(self, start: int) -> None:
        self.value = start

    @tool
    def bump(self) -> int:
        self.value += 1
        return self.value


class FakeRuntime:
    """Stands in for the rollout's runtime: tools only see what they are given."""

    def host_url(self, url: str) -> str:
        return url

    def __str__(self) -> str:
        return "RT"


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(fn())


def test_schema_from_type_hints() -> None:
    specs = {t.name: t for t in MathTools().specs()}
    assert list(specs) == ["add", "scale", "fail", "wait", "where"]
    assert specs["add"] == Tool(
        "add",
        "Add two integers.",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    )
    assert specs["scale"].description == "Multiply every number by a factor."
    assert specs["scale"].parameters == {
        "type": "object",
        "properties": {
            "xs": {"type": "array", "items": {"type": "number"}},
            "factor": {"type": "number", "default": 2.0},
            "label": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}], "default": None},
        },
        "required": ["xs"],
        "additionalProperties": False,
    }
    assert specs["wait"].parameters == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }


def test_runtime_parameter_is_injected_not_offered() -> None:
    specs = {t.name: t for t in MathTools().specs()}
    assert specs["where"].parameters["properties"] == {"path": {"type": "string", "default": "."}}
    assert specs["where"].parameters["required"] == []
    assert run(lambda: MathTools().call("where", {"path": "src"}, "RT")) == "RT src"  # type: ignore[arg-type]


def test_toolset_name_defaults_to_snake_case() -> None:
    class HTTPFetchTools(Toolset):
        pass

    assert MathTools.name == "math_tools"
    assert HTTPFetchTools.name == "http_fetch_tools"
    assert Counter.name == "counter"


def test_call_sync_and_async_tools() -> None:
    tools = MathTools()
    assert run(lambda: tools.call("add", {"a": 1, "b": 2}, None)) == "3"
    assert run(lambda: tools.call("scale", {"xs": [1, 2.5]}, None)) == '{"xs":[2.0,5.0],"label":null,"tags":null}'
    assert run(lambda: tools.call("add", {"a": "4", "b": 2}, None)) == "6"  # lax, like MCP


def test_call_validates_arguments_naming_the_bad_one() -> None:
    tools = MathTools()
    with pytest.raises(ToolInputError) as bad_type:
        run(lambda: tools.call("add", {"a": "one", "b": 2}, None))
    assert str(bad_type.value) == (
        "invalid arguments for tool 'add': a: Input should be a valid integer, unable to parse string as an integer"
    )
    assert bad_type.value.status_code == 400
    with pytest.raises(ToolInputError) as missing:
        run(lambda: tools.call("add", {"a": 1, "c": 3}, None))
    assert str(missing.value) == (
        "invalid arguments for tool 'add': b: Field required; c: Extra inputs are not permitted"
    )
    with pytest.raises(ToolInputError) as unknown:
        run(lambda: tools.call("nope", {}, None))
    assert str(unknown.value) == "unknown tool 'nope' in tool server 'math_tools'"
    assert unknown.value.status_code == 404


def test_tool_errors_propagate_from_call() -> None:
    with pytest.raises(ValueError, match="^boom$"):
        run(lambda: MathTools().call("fail", {"reason": "boom"}, None))


def test_bad_toolsets_are_rejected() -> None:
    class Twice(Toolset):
        @tool(name="x")
        def a(self) -> None: ...

        @tool(name="x")
        def b(self) -> None: ...

    class Star(Toolset):
        @tool
        def a(self, *args: int) -> None: ...

    with pytest.raises(ToolsetError, match="^Twice defines tool 'x' twice$"):
        Twice().specs()
    with pytest.raises(ToolsetError, match=r"^tool Star.a: \*args / \*\*kwargs are not supported$"):
        Star().specs()


# -- the server ---------------------------------------------------------------------------


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as resp:
        return resp.status, await resp.json()


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    async with http.post(f"{url}/call", data=data) as resp:
        return resp.status, await resp.json()


def test_server_lists_and_calls_tools() -> None:
    async def main() -> None:
        records: list[ToolCallRecord] = []
        async with ToolServer() as server, aiohttp.ClientSession() as http:
            async with server.serve([MathTools()], FakeRuntime(), "s", on_call=records.append) as urls:  # type: ignore[arg-type]
                url = urls["math_tools"]
                assert url.startswith(f"{server.base_url}/t/") and url.endswith("/math_tools")
                status, listing = await get(http, url)
                assert status == 200
                assert [t["function"]["name"] for t in listing["tools"]] == ["add", "scale", "fail", "wait", "where"]
                assert listing["tools"][0] == {
                    "type": "function",
                    "function": {
                        "name": "add",
                        "description": "Add two integers.",
                        "parameters": MathTools().specs()[0].parameters,
                    },
                }
                assert await post(http, url, {"name": "add", "arguments": {"a": 1, "b": 2}}) == (200, {"content": "3"})
                # OpenAI-style JSON-text arguments are accepted too
                assert await post(http, url, {"name": "where", "arguments": '{"path": "x"}'}) == (
                    200,
                    {"content": "RT x"},
                )
                assert await post(http, url, {"name": "fail", "arguments": {"reason": "no"}}) == (
                    200,
                    {"content": "ValueError: no", "is_error": True},
                )
                assert await post(http, url, {"name": "add", "arguments": {"a": "z", "b": 1}}) == (
                    400,
                    {
                        "error": "invalid arguments for tool 'add': a: Input should be a valid integer, "
                        "unable to parse string as an integer"
                    },
                )
                assert await post(http, url, {"name": "nope"}) == (
                    404,
                    {"error": "unknown tool 'nope' in tool server 'math_tools'"},
                )
                status, body = await post(http, url, b"{not json")
                assert status == 400 and body["error"].startswith("invalid tool call body: ")
                assert await get(http, url.rsplit("/", 1)[0] + "/other") == (
                    404,
                    {"error": "no tool server named 'other'"},
                )
        assert [(r.server, r.name, r.arguments, r.ok, r.error) for r in records] == [
            ("math_tools", "add", '{"a":1,"b":2}', True, None),
            ("math_tools", "where", '{"path":"x"}', True, None),
            ("math_tools", "fail", '{"reason":"no"}', False, "ValueError: no"),
            (
                "math_tools",
                "add",
                '{"a":"z","b":1}',
                False,
                "invalid arguments for tool 'add': a: Input should be a valid integer, "
                "unable to parse string as an integer",
            ),
            ("math_tools", "nope", "{}", False, "unknown tool 'nope' in tool server 'math_tools'"),
        ]
        assert all(0 <= r.duration < 10 for r in records)  # measured, not a hang

    run(main)


def test_call_timeout_is_an_error_result() -> None:
    async def main() -> None:
        records: list[ToolCallRecord] = []
        async with ToolServer(call_timeout=0.05) as server, aiohttp.ClientSession() as http:
            async with server.serve([MathTools()], None, on_call=records.append) as urls:
                assert await post(http, urls["math_tools"], {"name": "wait"}) == (
                    200,
                    {"content": "tool 'wait' timed out after 0.05s", "is_error": True},
                )
        assert [(r.name, r.ok, r.error) for r in records] == [("wait", False, "tool 'wait' timed out after 0.05s")]
        assert records[0].duration >= 0.05

    run(main)


def test_tokens_isolate_rollouts() -> None:
    async def main() -> None:
        async with ToolServer() as server, aiohttp.ClientSession() as http:
            async with server.serve([Counter(0)], None) as a, server.serve([Counter(100), MathTools()], None) as b:
                assert a["counter"] != b["counter"]
                assert await post(http, a["counter"], {"name": "bump"}) == (200, {"content": "1"})
                assert await post(http, b["counter"], {"name": "bump"}) == (200, {"content": "101"})
                # a's token does not reach b's other toolset
                forged = a["counter"].rsplit("/", 1)[0] + "/math_tools"
                assert await get(http, forged) == (404, {"error": "no tool server named 'math_tools'"})
                unknown = f"{server.base_url}/t/not-a-token/counter"
                assert await get(http, unknown) == (401, {"error": "unknown or expired tool server token"})
                assert await post(http, unknown, {"name": "bump"}) == (
                    401,
                    {"error": "unknown or expired tool server token"},
                )
            # after serve exits, the URLs are dead
            assert await post(http, a["counter"], {"name": "bump"}) == (
                401,
                {"error": "unknown or expired tool server token"},
            )
            assert await get(http, b["math_tools"]) == (401, {"error": "unknown or expired tool server token"})

    run(main)


def test_body_over_the_cap_is_413() -> None:
    async def main() -> None:
        async with ToolServer(max_body=200) as server, aiohttp.ClientSession() as http:
            async with server.serve([MathTools()], None) as urls:
                body = {"name": "fail", "arguments": {"reason": "x" * 500}}
                assert await post(http, urls["math_tools"], body) == (413, {"error": "request body over 200 bytes"})

    run(main)


def test_registration_errors() -> None:
    async def main() -> None:
        server = ToolServer()
        with pytest.raises(ToolsetError, match=r"^ToolServer.serve before start\(\)"):
            async with server.serve([Counter(0)], None):
                pass
        async with server:
            with pytest.raises(ToolsetError, match="^duplicate or invalid tool server name 'counter'$"):
                async with server.serve([Counter(0), Counter(1)], None):
                    pass
            with pytest.raises(ToolsetError, match="^not a Toolset: 3$"):
                async with server.serve([3], None):  # type: ignore[list-item]
                    pass

    run(main)


def test_serve_translates_urls_for_the_runtime() -> None:
    class Remote:
        def host_url(self, url: str) -> str:
            return url.replace("127.0.0.1", "host.internal")

    async def main() -> None:
        async with ToolServer() as server:
            async with server.serve([Counter(0)], Remote()) as urls:  # type: ignore[arg-type]
                assert urls["counter"].startswith(f"http://host.internal:{server.port}/t/")

    run(main)
