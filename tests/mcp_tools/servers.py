"""MCP servers for the tests, each a real process on loopback, stopped by its PID."""

from __future__ import annotations

import contextlib
import pathlib
import subprocess
import sys
from collections.abc import Iterator

SDK_SERVER = pathlib.Path(__file__).with_name("sdk_server.py")


@contextlib.contextmanager
def sdk_http_server(port: int | None = None) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """The SDK server over streamable HTTP: its URL and process (killed on exit)."""
    args = [sys.executable, str(SDK_SERVER), "http", *([str(port)] if port else [])]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once the socket listens: connections queue
        assert line.startswith("PORT "), f"the SDK server did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}/mcp", process
    finally:
        process.kill()
        process.wait(30)
        if process.stdout is not None:
            process.stdout.close()


def sdk_stdio_command() -> list[str]:
    return [sys.executable, str(SDK_SERVER), "stdio"]
