"""The routes a trainer drives a server with around a weight update: abort, pause, resume,
load weights, in the shapes of the dialect the server speaks (``engine_state.py`` does the work).

vLLM 0.32 (its dev-mode routes, ``VLLM_SERVER_DEV_MODE=1``; shapes recorded from the CPU build):

- ``POST /abort_requests`` ``{"request_ids": [...]}`` → ``{"status": "aborted", "aborted": N}``:
  ids as vLLM names requests (``chatcmpl-<X-Request-Id>``, ``generate-tokens-<...>``); none or
  ``[]``: every request in flight. ``N`` is how many ids were given (all: how many were found);
- ``POST /pause?mode=abort|keep|wait`` → ``{"status": "paused"}``; ``POST /resume`` →
  ``{"status": "resumed"}``; ``GET /is_paused`` → ``{"is_paused": bool}``;
- ``POST /update_weight_version`` ``{"new_version": "3"}`` → ``{"success": true, "new_version":
  "3"}`` and ``GET /weight_info`` → ``{"weight_version": "3"}``. vLLM only relabels here (its
  weights are reloaded by ``/collective_rpc`` or ``/update_weights``); the simulated model's
  weights *are* its version, so this route loads them;
- ``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path": ...}}`` →
  ``{"results": [null]}``: vLLM's in-place reload, a no-op here (the version is the weights), so
  that one weight-sync hook (reload, then relabel) drives both.

SGLang (``python/sglang/srt/entrypoints/http_server.py``, ``managers/io_struct.py``):

- ``POST /abort_request`` ``{"rid": "...", "abort_all": false}`` → 200, no body: every request
  whose ``rid`` starts with the one given;
- ``POST /pause_generation`` ``{"mode": "abort"|"in_place"|"retract"}`` and
  ``POST /continue_generation`` → ``{"message": ..., "status": "ok"}`` (``in_place`` and
  ``retract`` both keep the requests, as ``keep`` does);
- ``POST /update_weights_from_disk`` ``{"model_path": ..., "weight_version": "3",
  "abort_all_requests": false}`` → ``{"success": true, "message": ..., "num_paused_requests":
  0}``: holds new requests until those in flight finish (unless aborted), then loads version 3
  (``weight_version`` is required here: it is the simulated model's weights);
  ``POST /update_weight_version`` ``{"new_version": "3"}`` → ``{"success": true, "message": ...,
  "new_version": "3"}``. ``GET /model_info`` reports ``weight_version`` (``model_server.py``).

Versions are non-negative integers here, written as strings on the wire as both engines do.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from .engine_state import PAUSE_MODES, PauseMode
from .served import Served

__all__ = ["add_control_routes"]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_SGLANG_MODES: dict[str, PauseMode] = {"abort": "abort", "in_place": "keep", "retract": "keep"}


class _Bad(Exception):
    """A control request the server refuses with 400."""


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=_encode(payload), content_type="application/json")


def _bad(message: str, param: str | None) -> web.Response:
    return _json({"error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}}, 400)


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = _decode(raw) if raw.strip() else {}
    except msgspec.DecodeError:
        raise _Bad("Invalid JSON format") from None
    if not isinstance(body, dict):
        raise _Bad("Request body must be a JSON object")
    return body


def _version(value: Any, name: str) -> int:
    """A weight version: a non-negative integer, or its decimal string."""
    if isinstance(value, str) and value.isdecimal():
        return int(value)
    if type(value) is int and value >= 0:
        return value
    raise _Bad(
        f"'{name}' must be a non-negative integer (the simulated model's weights are its version), got {value!r}"
    )


class _Control:
    """The control routes of one server."""

    def __init__(self, server: Served) -> None:
        self.server, self.engine = server, server.engine

    async def abort_requests(self, request: web.Request) -> web.Response:
        ids = (await _body(request)).get("request_ids")
        if ids is not None and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
            raise _Bad("'request_ids' must be a list of strings")
        found = self.engine.abort(ids or None)
        return _json({"status": "aborted", "aborted": len(ids) if ids else found})

    async def pause(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "abort")
        if mode not in PAUSE_MODES:
            return _bad(f"'mode' must be one of {', '.join(PAUSE_MODES)}, got {mode!r}", "mode")
        await self.engine.pause(mode)
        return _json({"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        self.engine.resume()
        return _json({"status": "resumed"})

    async def is_paused(self, request: web.Request) -> web.Response:
        return _json({"is_paused": self.engine.paused is not None})

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await _body(request)
        self.server.policy_version = _version(body.get("new_version"), "new_version")
        if self.server.config.dialect == "vllm":
            return _json({"success": True, "new_version": str(self.server.policy_version)})
        if body.get("abort_all_requests"):
            self.engine.abort()
        return _json(
            {
                "success": True,
                "message": f"Weight version updated to {self.server.policy_version}",
                "new_version": str(self.server.policy_version),
            }
        )

    async def weight_info(self, request: web.Request) -> web.Response:
        return _json({"weight_version": str(self.server.policy_version)})

    async def collective_rpc(self, request: web.Request) -> web.Response:
        method = (await _body(request)).get("method")
        if method != "reload_weights":
            raise _Bad(
                f"the simulated model runs only 'reload_weights' (a no-op: its weights are its "
                f"version, loaded by /update_weight_version), got {method!r}"
            )
        return _json({"results": [None]})

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await _body(request)
        rid = body.get("rid")
        if rid is not None and not isinstance(rid, str):
            raise _Bad("'rid' must be a string")
        if body.get("abort_all"):
            self.engine.abort()
        elif rid:
            self.engine.abort([rid], prefix=True)
        return web.Response(status=200)

    async def pause_generation(self, request: web.Request) -> web.Response:
        mode = (await _body(request)).get("mode", "abort")
        if mode not in _SGLANG_MODES:
            raise _Bad(f"Invalid mode: {mode!r}. Expected one of {list(_SGLANG_MODES)}.")
        await self.engine.pause(_SGLANG_MODES[mode])
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        self.engine.resume()
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await _body(request)
        version = _version(body.get("weight_version"), "weight_version")
        if body.get("abort_all_requests"):
            self.engine.abort()
        if self.engine.paused is None:  # as SGLang's writer lock: wait for the requests in flight
            await self.engine.pause("wait")
            self.server.policy_version = version
            self.engine.resume()
        else:
            self.server.policy_version = version
        return _json({"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0})

    def routes(self) -> list[tuple[str, str, Any]]:
        if self.server.config.dialect == "vllm":
            return [
                ("POST", "/abort_requests", self.abort_requests),
                ("POST", "/pause", self.pause),
                ("POST", "/resume", self.resume),
                ("GET", "/is_paused", self.is_paused),
                ("POST", "/update_weight_version", self.update_weight_version),
                ("GET", "/weight_info", self.weight_info),
                ("POST", "/collective_rpc", self.collective_rpc),
            ]
        return [
            ("POST", "/abort_request", self.abort_request),
            ("POST", "/pause_generation", self.pause_generation),
            ("POST", "/continue_generation", self.continue_generation),
            ("POST", "/update_weights_from_disk", self.update_weights_from_disk),
            ("POST", "/update_weight_version", self.update_weight_version),
        ]


def _refusing(handler: Any) -> Any:
    """``handler``, answering a :class:`_Bad` request with 400."""

    async def wrapped(request: web.Request) -> web.Response:
        try:
            return await handler(request)  # type: ignore[no-any-return]
        except _Bad as exc:
            return _bad(str(exc), None)

    return wrapped


def add_control_routes(app: web.Application, server: Served) -> None:
    """Add the abort, pause and weight routes of ``server.config.dialect`` to ``app``."""
    for method, path, handler in _Control(server).routes():
        app.router.add_route(method, path, _refusing(handler))
