"""OpenAIModel reading an upstream SSE stream: however it is cut into network reads."""

from __future__ import annotations

import pytest
from aiohttp import web
from capture_rig import recording_server, run

from rollout_ray._errors import ProviderError
from rollout_ray._record.messages import Request, UserMessage
from rollout_ray._serving.upstream import LineSplitter, OpenAIModel
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer

EVENTS = [
    b'data: {"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"prompt_token_ids":[1,2]}',
    b'data: {"choices":[{"index":0,"delta":{"content":"fo"},"token_ids":[7],'
    b'"logprobs":{"content":[{"token":"fo","logprob":-0.5,"bytes":[102,111],"top_logprobs":[]}]}}]}',
    b'data: {"choices":[{"index":0,"delta":{"content":"ur"},"finish_reason":"stop","token_ids":[8],'
    b'"logprobs":{"content":[{"token":"ur","logprob":-0.25,"bytes":[117,114],"top_logprobs":[]}]}}]}',
    b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}',
    b"data: [DONE]",
]


def streamer(piece: int, separator: bytes = b"\n\n", last: bytes = b"\n\n"):  # type: ignore[no-untyped-def]
    raw = separator.join(EVENTS) + last

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(0, len(raw), piece):
            await response.write(raw[i : i + piece])
        await response.write_eof()
        return response

    return answer


@pytest.mark.parametrize(
    ("piece", "separator", "last"),
    [
        (1 << 20, b"\n\n", b"\n\n"),
        (7, b"\n\n", b"\n\n"),
        (1, b"\r\n\r\n", b"\r\n\r\n"),
        (64, b"\n\n", b""),
    ],
    ids=["one-read", "7-byte-reads", "crlf-1-byte-reads", "no-final-newline"],
)
@pytest.mark.parametrize("capture", [None, "vllm"])
def test_a_stream_assembles_the_same_however_it_arrives(
    piece: int, separator: bytes, last: bytes, capture: str | None
) -> None:
    async def main() -> None:
        async with recording_server(streamer(piece, separator, last)) as (url, _, _):
            model = OpenAIModel(url, stream=True, token_capture=capture)  # type: ignore[arg-type]
            response = await model.complete(Request([UserMessage("hi")]), model=None, sampling={})
            await model.aclose()
        assert response.message.content == "four" and response.finish_reason == "stop"
        assert response.usage is not None and response.usage.completion_tokens == 2
        if capture:
            assert (response.prompt_token_ids, response.token_ids) == ([1, 2], [7, 8])
            assert response.token_logprobs == [-0.5, -0.25]
        else:
            assert response.token_ids is None

    run(main)


@pytest.mark.parametrize("capture", [None, "vllm"])
def test_a_stream_cut_short_is_a_502_and_not_retried(capture: str | None) -> None:
    async def main() -> None:
        config = SimulatedModelConfig(ttft=0, rate_malformed=1.0)
        async with SimulatedModelServer(config) as server:
            model = OpenAIModel(server.base_url, stream=True, token_capture=capture)  # type: ignore[arg-type]
            with pytest.raises(ProviderError, match=r"^malformed stream") as info:
                await model.complete(Request([UserMessage("What is 2+2?")]), model=None, sampling={})
            await model.aclose()
            assert info.value.status_code == 502 and server.stats.requests == 1

    run(main)


@pytest.mark.parametrize("piece", [1, 2, 3, 5, 8, 1000])
def test_lines_split_the_same_however_the_bytes_arrive(piece: int) -> None:
    raw = b"data: a\r\n\ndata: bc\n\n\ndata: [DONE]"
    splitter = LineSplitter()
    lines = [line for i in range(0, len(raw), piece) for line in splitter.feed(raw[i : i + piece])]
    assert lines + splitter.end() == raw.split(b"\n")
