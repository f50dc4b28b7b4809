"""One model call of the session, continued across interrupts, each token with its version.

``generate`` asks the model once; if a pause interrupts the call (``Driver.paused(interrupt=
True)``, ``_core/policy_gate``), the model stops it at its server and raises ``Interrupted``
with what it sampled; the call waits out the pause here and the model continues it from its
partial output (``Model.resume``) under the version of the resume. The session gets one reply.

Versions: each token records the version that sampled it. The server's per-token word
(vLLM's ``weight_versions``) is taken where it gave one; elsewhere a token has the gate's
version when its segment (the first request, or a continuation) was sent.

A call its server aborted without an interrupt of ours (someone else paused the server with
``abort``) is continued at once, at most ``MAX_UNASKED_ABORTS`` times in a row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._errors import ProviderError
from .._record.messages import Request, Response
from .._record.trace import ModelCall
from .model import CallContext, Interrupted, Model
from .policy_gate import PolicyGate

MAX_UNASKED_ABORTS = 3
"""Aborts in a row by the server alone before the call fails (502)."""


async def generate(
    model: Model,
    request: Request,
    *,
    name: str | None,
    sampling: dict[str, Any],
    policy: PolicyGate,
    call: ModelCall,
    prefix: tuple[list[int] | None, int],
    check_open: Callable[[], None],
) -> Response:
    """The whole reply to ``request``; ``call.interrupts`` counts the interrupts.

    Raises:
        ProviderError: the server aborted the call ``MAX_UNASKED_ABORTS`` times in a row by itself.
        whatever the model or ``check_open`` raises (a call closed while paused).
    """
    segments: list[tuple[int, int | None]] = []  # (first token, the gate's version when sent)
    interrupted: Interrupted | None = None
    unasked = 0
    while True:
        segments.append((0 if interrupted is None else interrupted.sampled, policy.version))
        with policy.watch() as interrupt:
            context = CallContext(prefix[0], prefix[1], interrupt)
            try:
                if interrupted is None:
                    response = await model.generate(request, model=name, sampling=sampling, call=context)
                else:
                    response = await model.resume(request, interrupted, model=name, sampling=sampling, call=context)
                break
            except Interrupted as stopped:
                interrupted = stopped
                unasked = 0 if interrupt.fired else unasked + 1
        if unasked >= MAX_UNASKED_ABORTS:
            raise ProviderError(f"the model server aborted the call {unasked} times in a row", 502)
        call.interrupts += 1
        await policy.wait()
        check_open()
    if response.token_ids is not None and (call.interrupts or response.token_versions):
        response.token_versions = _versions(response, segments)
    return response


def _versions(response: Response, segments: list[tuple[int, int | None]]) -> list[int | None]:
    size = len(response.token_ids or ())
    given = response.token_versions if response.token_versions and len(response.token_versions) == size else None
    versions: list[int | None] = [None] * size
    bounds = [start for start, _ in segments[1:]] + [size]
    for (start, version), end in zip(segments, bounds):
        for i in range(start, min(end, size)):
            versions[i] = given[i] if given is not None and given[i] is not None else version
    return versions
