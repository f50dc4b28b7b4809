"""Fixtures of the real-server tests: a vLLM server with its interrupt and weight routes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from vllm_server import DevServer, serve_dev


@pytest.fixture(scope="module")
def vllm_dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """One vLLM server per module with the dev routes (abort, pause, reload, versions) and the
    token-in route, serving checkpoint A of the tiny model; ``.b`` is checkpoint B."""
    with serve_dev(tmp_path_factory.mktemp("vllm-dev")) as server:
        yield server
