"""Server-sent events out: ``data: {json}`` blocks, ``data: [DONE]``, and the malformed fault."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

__all__ = ["SSE"]

_encode = msgspec.json.Encoder().encode


class SSE:
    """One streamed answer. ``malformed``: cut short in the second event (no blank line after
    it, no ``[DONE]``), as a broken upstream does. A client that went away ends it quietly:
    there is nothing left to tell it."""

    def __init__(self, response: web.StreamResponse, malformed: bool = False) -> None:
        self.response = response
        self.cut = False
        self.gone = False
        self.sent = 0
        self._malformed = malformed

    @classmethod
    async def open(cls, request: web.Request, headers: dict[str, str], malformed: bool = False) -> SSE:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
        )
        await response.prepare(request)
        return cls(response, malformed)

    async def send(self, events: list[Any]) -> bool:
        """Write ``events`` in one write; ``False`` once the stream is cut (send nothing more)."""
        if self.cut or self.gone:
            return False
        blocks = []
        for event in events:
            data = _encode(event)
            self.sent += 1
            if self._malformed and self.sent == 2:
                blocks.append(b"data: " + data[: len(data) // 2])
                self.cut = True
                break
            blocks.append(b"data: " + data + b"\n\n")
        if blocks:
            await self._write(b"".join(blocks))
        return not (self.cut or self.gone)

    async def close(self) -> None:
        """``[DONE]`` (unless cut), then the end of the body."""
        if not self.cut:
            await self._write(b"data: [DONE]\n\n")
        if not self.gone:
            try:
                await self.response.write_eof()
            except ConnectionResetError:
                self.gone = True

    async def _write(self, data: bytes) -> None:
        if self.gone:
            return
        try:
            await self.response.write(data)
        except ConnectionResetError:
            self.gone = True
