"""MemoryRuntime: a runtime with no processes, for fast lifecycle tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from .._core.runtime import DEFAULT_OUTPUT_CAP, ProgramResult, Runtime
from .._errors import SandboxError

Program = Callable[[Sequence[str]], ProgramResult]


class MemoryRuntime(Runtime):
    """Files live in a dict; ``exec`` runs Python callables registered by program name.

    ``true`` always exists (so ``alive()`` works). Counts ``start_calls`` and ``stop_calls``;
    ``alive_result`` overrides what ``alive()`` answers (to simulate a dead box).
    """

    type = "memory"

    def __init__(self, name: str | None = None, *, programs: Mapping[str, Program] | None = None) -> None:
        super().__init__(name)
        self.files: dict[str, bytes] = {}
        self.programs: dict[str, Program] = {"true": lambda argv: ProgramResult(0)}
        self.programs.update(programs or {})
        self.start_calls = 0
        self.stop_calls = 0
        self.alive_result: bool | None = None

    async def _start(self) -> None:
        self.start_calls += 1

    async def _teardown(self) -> None:
        self.stop_calls += 1
        self.files.clear()

    async def alive(self) -> bool:
        if self.alive_result is not None:
            return self.alive_result
        return await super().alive()

    def _check_running(self) -> None:
        if not self.started or self.stopped:
            raise SandboxError(f"runtime {self.name!r} is not running")

    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_output: int = DEFAULT_OUTPUT_CAP,
        stdin: bytes | None = None,
    ) -> ProgramResult:
        self._check_running()
        program = self.programs.get(argv[0])
        if program is None:
            raise SandboxError(f"runtime {self.name!r}: no program {argv[0]!r}")
        return program(argv)

    async def read(self, path: str, max_bytes: int | None = None) -> bytes:
        self._check_running()
        try:
            data = self.files[path]
        except KeyError:
            raise FileNotFoundError(path) from None
        return data if max_bytes is None else data[:max_bytes]

    async def write(self, path: str, data: bytes | str) -> None:
        self._check_running()
        self.files[path] = data.encode() if isinstance(data, str) else data
