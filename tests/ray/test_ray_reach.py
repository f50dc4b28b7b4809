"""Joining Ray at an address nothing answers at fails at once, in one line, before ``ray.init``
(which would retry for ~40 s, printing C++ warnings); a live cluster's address passes."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("ray")

from rollout_ray._errors import RayUnreachable  # noqa: E402
from rollout_ray._ray.head import check_reachable, init_ray  # noqa: E402


@contextlib.contextmanager
def _refused_port() -> Iterator[int]:
    """A port that refuses connections while the block runs: bound, not listening, so no other
    process's server can take it meanwhile (as it could take a port closed and handed on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_an_address_nothing_listens_at_is_refused_before_ray_init(scheme: str) -> None:
    with _refused_port() as port:
        address = f"{scheme}127.0.0.1:{port}"
        started = time.monotonic()
        with pytest.raises(RayUnreachable, match=rf"^cannot reach Ray at {address} \(Connection refused\)$") as info:
            init_ray(address)
    assert time.monotonic() - started < 30  # a hang guard: Ray's own retries would take ~40 s
    assert info.value.address == address


@pytest.mark.ray
def test_a_live_cluster_and_the_addresses_ray_resolves_pass(ray_cluster: Any) -> None:
    check_reachable(ray_cluster.get_runtime_context().gcs_address)
    for resolved_by_ray in ("auto", "local"):
        check_reachable(resolved_by_ray)
