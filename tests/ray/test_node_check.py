"""Issue 32 §2: ``rollout-ray eval`` on a remote cluster says in one line, before any rollout
runs, which nodes cannot run the runtime asked for: each node is asked (a zero-CPU task on
it runs the provider's check there), never judged by the driver's machine."""

from __future__ import annotations

import asyncio

import pytest

from rollout_ray._cli.protections import nodes_line
from rollout_ray._ray.node_check import nodes_lacking
from rollout_ray._runtimes import providers

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


def test_a_node_that_cannot_run_the_kind_is_named_in_one_line() -> None:
    """A provider registered here only (as a plugin installed on the driver, not the node):
    the node, asked, has none; every node runs the local kind."""
    providers.register(providers.Provider("driver-only", lambda *a: None, providers.Capabilities()))  # type: ignore[arg-type,return-value]
    try:

        async def main() -> tuple[tuple[dict[str, str], int], tuple[dict[str, str], int]]:
            return await nodes_lacking("driver-only"), await nodes_lacking("local")

        (lacking, asked), local = asyncio.run(main())
    finally:
        providers._registry.pop("driver-only")
    assert local == ({}, 1) and asked == 1
    ((address, reason),) = lacking.items()
    assert reason == "no runtime provider 'driver-only' on this node: install the package declaring it there"
    line = nodes_line("driver-only", lacking, 1)
    assert line is not None and "\n" not in line
    assert line.startswith(
        f"rollout-ray: 1 of 1 nodes cannot run the driver-only runtime ({address}: no runtime provider"
    )
    assert line.endswith(
        "rollouts there fail; pass --runtime local to run them without isolation "
        "(pod security: docs/runtime-providers.md)"
    )
    assert nodes_line("auto", {address: "bwrap cannot create namespaces"}, 3) == (
        f"rollout-ray: 1 of 3 nodes cannot run the sandbox runtime ({address}: bwrap cannot create namespaces): "
        "rollouts there run in the local runtime, isolated neither from each other nor from the host "
        "(pod security: docs/runtime-providers.md)"
    )
    assert nodes_line("auto", {}, 3) is None
