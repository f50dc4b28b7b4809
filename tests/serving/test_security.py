"""Hostile clients against the proxy and the tool server (§5.1, §5.2, §5.5), fuzzed.

Whatever arrives (bad JSON, wrong shapes, huge or stalled bodies, huge or many headers, bad
bytes, wrong secrets, methods, paths), the answer is a 4xx, or a 200 for a valid request: never
a 5xx, never an unhandled error in the server's log, never a hang. A request reaches only the
rollout whose secret it carries, and the server still serves both rollouts afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp.http_exceptions import HttpProcessingError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from yarl import URL

from rollout_ray import RolloutSession, ToolCallRecord, Trace, TraceTask
from rollout_ray._core.toolset import Toolset, tool
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray._serving.tool_server import ToolServer
from rollout_ray.testing import ScriptedModel

pytestmark = pytest.mark.security

MAX_BODY = 64 << 10
READ_TIMEOUT = 0.25
"""The servers' bound on receiving headers and body; small, so stalled clients are cut fast."""
BOUND = 5.0
"""Every exchange must finish within this; longer is a hang."""

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FEW = settings(FUZZ, max_examples=4)  # each example waits out READ_TIMEOUT

NESTED = b"[" * 20_000 + b"]" * 20_000
"""JSON nested past msgspec's limit, the recursion limit (which Hypothesis raises while it runs a
test), so decoding raises RecursionError, not DecodeError; under MAX_BODY."""
DEEP_CHAT = b'{"messages": [{"role": "user", "content": "hi"}], "x": ' + NESTED + b"}"
DEEP_TOOLS = (
    b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
    b'"function": {"name": "f", "parameters": {"x": ' + NESTED + b"}}}]}"
)
DEEP_CALL = b'{"name": "bump", "arguments": {"by": ' + NESTED + b"}}"
DEEP_CALL_TEXT = b'{"name": "bump", "arguments": "{\\"by\\": ' + NESTED + b'}"}'


# -- the two servers, each with two rollouts --------------------------------------------------


class Box(Toolset):
    name = "box"

    def __init__(self) -> None:
        self.bumps = 0

    @tool
    def bump(self, by: int = 1) -> int:
        self.bumps += by
        return self.bumps

    @tool
    async def echo(self, text: str, items: list[int] | None = None) -> str:
        return f"{text} {items}"


class WatchedProxy(HTTPInterception):
    """Signals when a model call's handler is past its secret check, and when it has returned."""

    entered: asyncio.Event
    left: asyncio.Event

    async def _registered_call(self, dialect: Any, request: Any, reg: Any, *rest: Any) -> Any:
        self.entered.set()
        try:
            return await super()._registered_call(dialect, request, reg, *rest)
        finally:
            self.left.set()


class WatchedTools(ToolServer):
    entered: asyncio.Event
    left: asyncio.Event

    async def _call(self, request: Any, reg: Any, toolset: Toolset, *rest: Any) -> Any:
        self.entered.set()
        try:
            return await super()._call(request, reg, toolset, *rest)
        finally:
            self.left.set()


@dataclass
class Rig:
    """A started server with rollouts "a" and "b", driven on one event loop."""

    server: WatchedProxy | WatchedTools
    client: aiohttp.ClientSession
    urls: dict[str, str]
    """owner -> the URL of a valid call ("a", "b", or "x" for an unregistered one)."""
    auth: dict[str, dict[str, str]]
    """owner -> the headers of a valid call."""
    valid: bytes
    footprint: Callable[[str], tuple[int, ...]]
    """What a call leaves on rollout "a" or "b": turns and model calls, or tool calls."""
    state_secrets: dict[str, str]
    """owner -> the proxy's state secret (not a model bearer); empty for the tool server."""

    @property
    def port(self) -> int:
        return self.server.port

    def footprints(self) -> dict[str, tuple[int, ...]]:
        return {owner: self.footprint(owner) for owner in ("a", "b")}

    def watch(self) -> None:
        self.server.entered, self.server.left = asyncio.Event(), asyncio.Event()

    async def request(
        self, method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        async with asyncio.timeout(BOUND):
            async with self.client.request(method, url, data=body, headers=headers) as resp:
                return resp.status, await resp.read()

    async def call(self, owner: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        return await self.request("POST", self.urls[owner], body, {**self.auth[owner], **(headers or {})})

    async def assert_healthy(self) -> None:
        for owner in ("a", "b"):
            before = self.footprint(owner)
            status, _ = await self.call(owner, self.valid)
            assert status == 200 and self.footprint(owner) > before


@asynccontextmanager
async def proxy_rig() -> AsyncIterator[Rig]:
    sessions = {o: RolloutSession(Trace(task=TraceTask(type="T")), ScriptedModel(default=o)) for o in "ab"}
    async with AsyncExitStack() as stack:
        server = WatchedProxy(max_body=MAX_BODY, read_timeout=READ_TIMEOUT)
        await stack.enter_async_context(server)
        slots = {o: await stack.enter_async_context(server.serve(s)) for o, s in sessions.items()}
        client = await stack.enter_async_context(new_client())
        url = f"{server.base_url}/v1/chat/completions"
        auth = {o: {"Authorization": f"Bearer {slot.model_secret}"} for o, slot in slots.items()}
        auth["x"] = {"Authorization": "Bearer not-a-registered-secret"}
        rig = Rig(
            server,
            client,
            {"a": url, "b": url, "x": url},
            auth,
            msgspec.json.encode(VALID_CHAT),
            lambda o: (sessions[o].trace.num_turns, len(sessions[o].trace.nodes), len(sessions[o].trace.calls)),
            {o: slot.state_secret for o, slot in slots.items()},
        )
        rig.watch()
        yield rig
        await rig.assert_healthy()


@asynccontextmanager
async def tool_rig() -> AsyncIterator[Rig]:
    boxes = {o: Box() for o in "ab"}
    records: dict[str, list[ToolCallRecord]] = {"a": [], "b": []}
    async with AsyncExitStack() as stack:
        server = WatchedTools(max_body=MAX_BODY, read_timeout=READ_TIMEOUT)
        await stack.enter_async_context(server)
        urls = {
            o: (await stack.enter_async_context(server.serve([boxes[o]], None, on_call=records[o].append)))["box"]
            + "/call"
            for o in "ab"
        }
        urls["x"] = f"{server.base_url}/t/not-a-registered-token/box/call"
        client = await stack.enter_async_context(new_client())
        rig = Rig(
            server,
            client,
            urls,
            {"a": {}, "b": {}, "x": {}},
            msgspec.json.encode({"name": "bump"}),
            lambda o: (boxes[o].bumps, len(records[o])),
            {},
        )
        rig.watch()
        yield rig
        await rig.assert_healthy()


RIGS = {"proxy": proxy_rig, "tools": tool_rig}


def new_client() -> aiohttp.ClientSession:
    # A fresh connection per request: the servers close idle ones after READ_TIMEOUT, and a
    # pooled connection closing just as a request goes out would fail that request.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


@contextlib.contextmanager
def running(kind: str, caplog: pytest.LogCaptureFixture) -> Iterator[tuple[Rig, Callable[[Any], Any]]]:
    """One loop for the whole test: yields the rig and ``run(coro)``; checks health at exit."""
    caplog.set_level(logging.WARNING)
    with asyncio.Runner() as runner:
        rig_cm = RIGS[kind]()
        rig = runner.run(rig_cm.__aenter__())
        try:
            yield rig, runner.run
        except BaseException as e:
            runner.run(rig_cm.__aexit__(type(e), e, e.__traceback__))
            raise
        else:
            runner.run(rig_cm.__aexit__(None, None, None))
    # An unhandled error in a handler is logged by aiohttp even when no client sees its 500.
    # (aiohttp also logs, with a traceback, each malformed request it answers 400 itself.)
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and not (r.exc_info and isinstance(r.exc_info[1], HttpProcessingError))
    ]
    assert errors == []


def assert_4xx_or_ok(status: int) -> None:
    assert status == 200 or 400 <= status < 500, f"server answered {status}"


# -- strategies ----------------------------------------------------------------------------

VALID_CHAT = {"model": "m", "messages": [{"role": "user", "content": "2+2?"}]}

short_text = st.text(max_size=8)
json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | short_text
)
json_value = st.recursive(
    json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(short_text, inner, max_size=3), max_leaves=6
)


def either(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field that is sometimes well-formed and sometimes any JSON at all."""
    return st.one_of(valid, valid, json_value)


content_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": either(short_text)}),
    st.fixed_dictionaries(
        {"type": st.just("image_url"), "image_url": either(st.fixed_dictionaries({"url": either(short_text)}))}
    ),
    st.fixed_dictionaries(
        {"type": either(st.sampled_from(["input_audio", "file", ""]))}, optional={"text": json_value}
    ),
)
content = st.one_of(short_text, st.lists(either(content_part), max_size=3), json_value)
tool_call = st.fixed_dictionaries(
    {
        "id": either(short_text),
        "type": either(st.just("function")),
        "function": either(
            st.fixed_dictionaries(
                {"name": either(short_text)}, optional={"arguments": either(st.just('{"a": 1}') | short_text)}
            )
        ),
    }
)
message = st.fixed_dictionaries(
    {"role": either(st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", ""]))},
    optional={
        "content": content,
        "tool_calls": either(st.lists(tool_call, max_size=2)),
        "tool_call_id": either(short_text),
        "name": either(short_text),
        "reasoning_content": either(short_text),
    },
)
tool_spec = st.fixed_dictionaries(
    {
        "type": either(st.just("function")),
        "function": either(
            st.fixed_dictionaries(
                {"name": either(short_text)},
                optional={
                    "description": either(short_text),
                    "strict": either(st.booleans()),
                    "parameters": either(st.dictionaries(short_text, json_value, max_size=2)),
                },
            )
        ),
    }
)
chat_body = st.fixed_dictionaries(
    {"messages": either(st.lists(message, min_size=1, max_size=3))},
    optional={
        "model": either(short_text),
        "tools": either(st.lists(tool_spec, max_size=2)),
        "tool_choice": either(
            st.sampled_from(["auto", "none", "required"])
            | st.fixed_dictionaries(
                {"type": st.just("function"), "function": st.fixed_dictionaries({"name": short_text})}
            )
        ),
        "n": either(st.integers(1, 4)),
        "stream": either(st.booleans()),
        "stream_options": either(st.fixed_dictionaries({"include_usage": either(st.booleans())})),
        "max_tokens": either(st.integers(1, 100)),
        "temperature": either(st.floats(0, 2)),
        "top_p": either(st.floats(0, 1)),
        "stop": either(st.lists(short_text, max_size=2) | short_text),
        "seed": either(st.integers()),
        "logprobs": either(st.booleans()),
        "response_format": json_value,
    },
)
tool_body = st.fixed_dictionaries(
    {"name": either(st.sampled_from(["bump", "echo", "nope", "_bind", "__init__"]))},
    optional={
        "arguments": st.one_of(
            either(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "by": either(st.integers()),
                        "text": either(short_text),
                        "items": either(st.lists(st.integers(), max_size=2)),
                    },
                )
            ),
            st.dictionaries(short_text, json_value, max_size=2).map(lambda v: msgspec.json.encode(v).decode()),
            short_text,
        )
    },
)


text_part = st.fixed_dictionaries(
    {"type": either(st.sampled_from(["input_text", "output_text", "text", "input_image", "input_file", "image"]))},
    optional={"text": either(short_text), "image_url": either(short_text), "source": json_value},
)
response_item = st.one_of(
    st.fixed_dictionaries(
        {"role": either(st.sampled_from(["user", "assistant", "developer", "system", ""]))},
        optional={
            "type": either(st.just("message")),
            "content": either(short_text | st.lists(either(text_part), max_size=2)),
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call")},
        optional={"call_id": either(short_text), "name": either(short_text), "arguments": either(short_text)},
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call_output")},
        optional={
            "call_id": either(short_text),
            "output": either(short_text | st.lists(either(text_part), max_size=2)),
        },
    ),
    st.fixed_dictionaries(
        {"type": either(st.sampled_from(["reasoning", "web_search_call", "item_reference"]))},
        optional={"summary": json_value, "content": json_value},
    ),
)
responses_body = st.fixed_dictionaries(
    {"input": either(short_text | st.lists(either(response_item), max_size=4))},
    optional={
        "instructions": either(short_text),
        "previous_response_id": either(short_text),
        "stream": either(st.booleans()),
        "tools": either(
            st.lists(
                st.fixed_dictionaries(
                    {"type": either(st.sampled_from(["function", "web_search"]))},
                    optional={"name": either(short_text), "parameters": json_value},
                ),
                max_size=2,
            )
        ),
        "tool_choice": json_value | st.sampled_from(["auto", "none", "required"]),
        "max_output_tokens": json_value,
        "reasoning": json_value,
        "text": json_value,
        "store": json_value,
    },
)
block = st.fixed_dictionaries(
    {"type": either(st.sampled_from(["text", "image", "tool_use", "tool_result", "thinking", "document"]))},
    optional={
        "text": either(short_text),
        "id": either(short_text),
        "name": either(short_text),
        "input": json_value,
        "tool_use_id": either(short_text),
        "content": json_value,
        "thinking": either(short_text),
        "source": json_value,
        "cache_control": json_value,
    },
)
messages_body = st.fixed_dictionaries(
    {
        "messages": either(
            st.lists(
                st.fixed_dictionaries(
                    {"role": either(st.sampled_from(["user", "assistant", "system", ""]))},
                    optional={"content": either(short_text | st.lists(either(block), max_size=3))},
                ),
                max_size=3,
            )
        )
    },
    optional={
        "system": either(short_text | st.lists(either(block), max_size=2)),
        "max_tokens": json_value,
        "stream": either(st.booleans()),
        "tool_choice": json_value,
        "stop_sequences": json_value,
        "thinking": json_value,
        "tools": either(
            st.lists(
                st.fixed_dictionaries(
                    {"name": either(short_text)}, optional={"input_schema": json_value, "type": json_value}
                ),
                max_size=2,
            )
        ),
    },
)


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def deep_inside(body: bytes, depth: int) -> bytes:
    """``body`` (a JSON object) with one more field, a list nested ``depth`` deep."""
    return body[:-1] + b', "deep": ' + nested(depth) + b"}"


def encoded(bodies: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[bytes]:
    """JSON bodies of any shape, plus bytes that are not JSON or not UTF-8 at all."""
    return st.one_of(
        st.one_of(bodies, json_value).map(msgspec.json.encode),
        st.binary(max_size=64),
        bodies.map(lambda b: msgspec.json.encode(b)[:-1] + b"\xff\xfe}"),
        st.builds(deep_inside, bodies.map(msgspec.json.encode), st.integers(1, 25_000)),
    )


# -- JSON bodies, secrets, methods and paths, over aiohttp ------------------------------------


@pytest.mark.parametrize("kind", ["proxy", "tools"])
def test_any_body_gets_4xx_or_200_and_reaches_only_its_rollout(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    with running(kind, caplog) as (rig, run):
        deep = [DEEP_CHAT, DEEP_TOOLS] if kind == "proxy" else [DEEP_CALL, DEEP_CALL_TEXT]

        @FUZZ
        @given(body=encoded(chat_body if kind == "proxy" else tool_body), owner=st.sampled_from("ab"))
        @example(body=deep[0], owner="a")  # was a 500: RecursionError escaped the JSON decoding
        @example(body=deep[1], owner="b")  # ditto, deep in a typed field / in arguments as JSON text
        def check(body: bytes, owner: str) -> None:
            other = "b" if owner == "a" else "a"
            before = rig.footprints()
            status, answer = run(rig.call(owner, body))
            assert_4xx_or_ok(status)
            assert rig.footprint(other) == before[other]
            if kind == "proxy":  # a turn is committed exactly when the answer is a 200
                assert rig.footprint(owner)[0] == before[owner][0] + (status == 200)
            if status == 200:  # a completion, a streamed one, or a tool result
                assert answer.startswith((b'{"id":"chatcmpl-', b"data: ", b'{"content":'))

        check()


@pytest.mark.parametrize(
    ("path", "bodies"),
    [("/v1/responses", responses_body), ("/v1/messages", messages_body), ("/v1/messages/count_tokens", messages_body)],
)
def test_any_body_in_another_dialect_gets_4xx_or_200(path: str, bodies: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The Responses and Messages readers are written by hand: any shape is a 400 naming the
    field (or is dropped), never a 500; a turn is committed exactly when the answer is a 200."""
    with running("proxy", caplog) as (rig, run):
        url = rig.urls["a"].replace("/v1/chat/completions", path)

        @FUZZ
        @given(body=encoded(bodies))
        @example(body=b'{"input": "hi", "x": ' + NESTED + b"}")
        @example(body=b'{"input": "hi", "temperature": ' + str(2**70).encode() + b"}")  # not recordable
        def check(body: bytes) -> None:
            before = rig.footprints()
            status, _ = run(rig.request("POST", url, body, rig.auth["a"]))
            assert_4xx_or_ok(status)
            assert rig.footprint("b") == before["b"]
            counted = path.endswith("count_tokens")
            assert rig.footprint("a")[0] == before["a"][0] + (status == 200 and not counted)

        check()


AUTH_KINDS = ["own", "other", "made_up", "missing", "empty", "basic", "state", "own+1", "own-1", "lower", "padded"]


def proxy_headers(rig: Rig, kind: str, owner: str, made_up: str) -> tuple[dict[str, str], str | None]:
    """Headers for an auth ``kind`` and the rollout they must reach (None: no rollout)."""
    other = "b" if owner == "a" else "a"
    mine = rig.auth[owner]["Authorization"].removeprefix("Bearer ")
    state = rig.state_secrets[owner]
    return {
        "own": (dict(rig.auth[owner]), owner),
        "other": (dict(rig.auth[other]), other),
        "made_up": ({"Authorization": f"Bearer {made_up}"}, None),
        "missing": ({}, None),
        "empty": ({"Authorization": ""}, None),
        "basic": ({"Authorization": f"Basic {mine}"}, None),
        "state": ({"Authorization": f"Bearer {state}"}, None),
        "own+1": ({"Authorization": f"Bearer {mine}x"}, None),
        "own-1": ({"Authorization": f"Bearer {mine[:-1]}"}, None),
        "lower": ({"Authorization": f"bearer {mine}"}, owner),
        "padded": ({"Authorization": f"Bearer   {mine}  "}, owner),
    }[kind]


def test_proxy_secret_reaches_exactly_its_own_rollout(caplog: pytest.LogCaptureFixture) -> None:
    with running("proxy", caplog) as (rig, run):

        @FUZZ
        @given(
            auth=st.sampled_from(AUTH_KINDS),
            owner=st.sampled_from("ab"),
            made_up=st.text(
                alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_", min_size=1, max_size=40
            ),
            body=st.sampled_from([VALID_CHAT, {**VALID_CHAT, "stream": True}, {"messages": 3}]),
            retry=st.sampled_from([None, "0", "1", "x"]),
        )
        @example(auth="other", owner="a", made_up="x", body=VALID_CHAT, retry=None)
        @example(auth="made_up", owner="a", made_up="x", body=VALID_CHAT, retry="1")
        def check(auth: str, owner: str, made_up: str, body: Any, retry: str | None) -> None:
            headers, reached = proxy_headers(rig, auth, owner, made_up)
            if retry is not None:
                headers["x-stainless-retry-count"] = retry
            before = rig.footprints()

            async def post() -> tuple[int, bytes]:
                return await rig.request("POST", rig.urls["a"], msgspec.json.encode(body), headers)

            status, _ = run(post())
            assert_4xx_or_ok(status)
            for o in "ab":
                if o != reached:
                    assert rig.footprint(o) == before[o], f"{auth} secret of {owner} touched rollout {o}"
            if reached is None:
                assert status == 401

        check()


def test_tool_token_reaches_exactly_its_own_rollout(caplog: pytest.LogCaptureFixture) -> None:
    with running("tools", caplog) as (rig, run):
        base = rig.urls["a"].split("/t/")[0]
        tokens = {o: rig.urls[o].split("/")[-3] for o in "ab"}

        @FUZZ
        @given(
            token=st.one_of(
                st.sampled_from(["a", "b"]),
                st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=40),
            ),
            name=st.sampled_from(["box", "other", "Box", ""]),
            body=tool_body,
        )
        @example(token="a", name="box", body={"name": "bump"})
        def check(token: str, name: str, body: Any) -> None:
            reached = token if token in tokens else None
            before = rig.footprints()
            url = f"{base}/t/{tokens.get(token, token)}/{name}/call"
            status, _ = run(rig.request("POST", url, msgspec.json.encode(body)))
            assert_4xx_or_ok(status)
            for o in "ab":
                if o != reached or name != "box":
                    assert rig.footprint(o) == before[o]
            if reached is None:
                assert status in (401, 404)  # 404: an empty path segment matches no route

        check()


METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE", "PROPFIND"]
CONTENT_TYPES = [
    "application/json",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=zz",
    "application/json; charset=latin-1",
    "",
    "*/*;;",
]


@pytest.mark.parametrize("kind", ["proxy", "tools"])
def test_wrong_method_path_or_content_type_is_never_5xx(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    with running(kind, caplog) as (rig, run):
        good = rig.urls["a"]
        base = good.split("/v1/")[0] if kind == "proxy" else good.split("/t/")[0]
        paths = [
            good[len(base) :],
            "/",
            "/v1/models",
            "/task",
            "/v1/chat/completions/",
            "/V1/chat/completions",
            "/v1/../task",
            "/t/",
            "/t//box/call",
            good[len(base) :].rsplit("/", 1)[0],
            good[len(base) :] + "/more",
            "/%00",
            "/%ff%fe",
        ]

        @FUZZ
        @given(
            method=st.sampled_from(METHODS),
            path=st.one_of(st.sampled_from(paths), st.text(max_size=20).map(lambda t: "/" + t)),
            content_type=st.one_of(
                st.sampled_from(CONTENT_TYPES),
                st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
            ),
        )
        @example(method="POST", path=good[len(base) :], content_type="text/plain")
        def check(method: str, path: str, content_type: str) -> None:
            before = rig.footprints()
            url = URL(base + path.replace("?", "%3F").replace("#", "%23"))
            headers = {**rig.auth["a"], "Content-Type": content_type}
            status, _ = run(rig.request(method, str(url), rig.valid, headers))
            assert_4xx_or_ok(status)
            if status != 200 or method != "POST":
                assert rig.footprints() == before

        check()


@pytest.mark.parametrize("kind", ["proxy", "tools"])
def test_body_over_the_cap_is_413_and_leaves_no_trace(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    with running(kind, caplog) as (rig, run):

        @settings(FUZZ, max_examples=10)
        @given(size=st.integers(MAX_BODY + 1, 4 * MAX_BODY), owner=st.sampled_from("abx"), raw=st.booleans())
        @example(size=MAX_BODY + 1, owner="a", raw=False)
        def check(size: int, owner: str, raw: bool) -> None:
            before = rig.footprints()
            body = rig.valid[:-1] + b" " * size + b"}"
            if raw:  # announcing a terabyte, sending just over the cap
                status = run(exchange(rig, head(rig, owner, length=1 << 40) + body))
            else:
                status, _ = run(rig.call(owner, body))
            assert status == (401 if owner == "x" else 413)
            assert rig.footprints() == before

        check()


# -- raw TCP: headers, bytes and bodies an HTTP client would not send ---------------------------


def head(
    rig: Rig, owner: str, extra: Sequence[bytes] = (), *, length: int | None = None, chunked: bool = False
) -> bytes:
    path = rig.urls[owner].split(f":{rig.port}", 1)[1].encode()
    lines = [b"POST " + path + b" HTTP/1.1", b"Host: 127.0.0.1"]
    lines += [f"{k}: {v}".encode() for k, v in rig.auth[owner].items()]
    lines.append(
        b"Transfer-Encoding: chunked"
        if chunked
        else b"Content-Length: %d" % (len(rig.valid) if length is None else length)
    )
    return b"\r\n".join(lines + list(extra)) + b"\r\n\r\n"


@asynccontextmanager
async def connection(rig: Rig) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def status_of(reader: asyncio.StreamReader) -> int | None:
    """The status of the response on ``reader``; None if the server closed without one."""
    async with asyncio.timeout(BOUND):
        try:
            line = await reader.readline()
        except ConnectionResetError:
            return None
    return int(line.split()[1]) if line else None


async def exchange(rig: Rig, data: bytes) -> int | None:
    async with connection(rig) as (reader, writer):
        writer.write(data)
        with contextlib.suppress(ConnectionError):  # the server may answer and close early
            await writer.drain()
        return await status_of(reader)


header_name = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).map(lambda s: "x-" + s)
hostile_headers = st.one_of(
    st.integers(8200, 70000).map(lambda n: [b"X-Huge: " + b"h" * n]),  # over aiohttp's field size
    st.integers(129, 600).map(lambda n: [b"X-Many-%d: v" % i for i in range(n)]),  # over its count
    st.lists(
        st.tuples(header_name, st.binary(max_size=40)).map(
            lambda kv: kv[0].encode() + b": " + kv[1].replace(b"\r", b"").replace(b"\n", b"")
        ),
        max_size=6,
    ),
    st.binary(max_size=40).map(lambda v: [b"Authorization: Bearer " + v.replace(b"\r", b"").replace(b"\n", b"")]),
    st.binary(min_size=1, max_size=60).map(lambda v: [v]),  # a raw line: maybe not a header at all
)


@pytest.mark.parametrize("kind", ["proxy", "tools"])
def test_huge_many_or_binary_headers_are_never_5xx(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    with running(kind, caplog) as (rig, run):

        @settings(FUZZ, max_examples=40)
        @given(extra=hostile_headers, owner=st.sampled_from("abx"))
        @example(extra=[b"X-Huge: " + b"h" * 70000], owner="a")
        @example(extra=[b"X-Many-%d: v" % i for i in range(600)], owner="a")
        @example(extra=[b"Authorization: Bearer \xff\xfe\x00"], owner="x")
        def check(extra: list[bytes], owner: str) -> None:
            before = rig.footprints()
            status = run(exchange(rig, head(rig, owner, extra) + rig.valid))
            assert status is not None, "closed without an answer"
            assert_4xx_or_ok(status)
            if status != 200:
                assert rig.footprints() == before
            if owner == "x":
                assert status != 200

        check()


@pytest.mark.parametrize("kind", ["proxy", "tools"])
def test_stalled_or_trickled_body_is_cut_off_with_408(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    with running(kind, caplog) as (rig, run):

        async def slow(sent: int, chunked: bool, trickle: bool) -> tuple[int | None, float]:
            rig.watch()
            loop = asyncio.get_running_loop()
            async with connection(rig) as (reader, writer):
                # Announce far more than is ever sent, so that even the trickle never completes it.
                writer.write(head(rig, "a", length=1 << 16, chunked=chunked))
                body = rig.valid[:sent]
                writer.write(b"%x\r\n%s" % (1 << 16, body) if chunked else body)
                async with asyncio.timeout(BOUND):
                    await rig.server.entered.wait()  # the handler is reading the body now
                started = loop.time()
                async with asyncio.TaskGroup() as tg:
                    if trickle:  # a byte every 20 ms: each read progresses, the whole never ends
                        dripping = tg.create_task(drip(writer))
                    status = await status_of(reader)
                    if trickle:
                        dripping.cancel()
                return status, loop.time() - started

        @FEW
        @given(
            sent=st.integers(0, len(msgspec.json.encode(VALID_CHAT)) - 1), chunked=st.booleans(), trickle=st.booleans()
        )
        @example(sent=1, chunked=False, trickle=False)  # was a hang: the handler waited forever
        @example(sent=1, chunked=False, trickle=True)
        def check(sent: int, chunked: bool, trickle: bool) -> None:
            before = rig.footprints()
            status, waited = run(slow(sent, chunked, trickle))
            assert status == 408 and waited < READ_TIMEOUT + 1.0
            assert rig.server.left.is_set()  # the handler is gone, not merely the connection
            assert rig.footprints() == before

        check()


async def drip(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while True:
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("kind", ["proxy", "tools"])
def test_client_hanging_up_mid_body_is_not_a_server_error(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    with running(kind, caplog) as (rig, run):

        async def hang_up(sent: int) -> None:
            rig.watch()
            async with connection(rig) as (_, writer):
                writer.write(head(rig, "a", length=len(rig.valid) + 10) + rig.valid[:sent])
                async with asyncio.timeout(BOUND):
                    await rig.server.entered.wait()
            # Was an unhandled ConnectionResetError, logged by aiohttp as a failed request.
            async with asyncio.timeout(BOUND):
                await rig.server.left.wait()

        @settings(FUZZ, max_examples=5)
        @given(sent=st.integers(0, 10))
        @example(sent=1)
        def check(sent: int) -> None:
            before = rig.footprints()
            run(hang_up(sent))
            assert rig.footprints() == before

        check()


@pytest.mark.parametrize("kind", ["proxy", "tools"])
def test_stalled_headers_are_closed_and_block_nobody(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    with running(kind, caplog) as (rig, run):

        async def stall(cut: int) -> tuple[bytes, float]:
            loop = asyncio.get_running_loop()
            async with connection(rig) as (reader, writer):
                writer.write(head(rig, "a")[:cut])
                await writer.drain()
                started = loop.time()
                await rig.assert_healthy()  # other clients are served meanwhile
                async with asyncio.timeout(BOUND):
                    try:
                        rest = await reader.read()
                    except ConnectionResetError:
                        rest = b""
                return rest, loop.time() - started

        @FEW
        @given(cut=st.integers(0, 40))
        @example(cut=20)  # was held open for aiohttp's default keep-alive timeout, an hour
        def check(cut: int) -> None:
            rest, waited = run(stall(cut))
            assert rest == b"" and waited < READ_TIMEOUT + 1.0  # closed, without an answer

        check()
