"""Our rollout's runtime with the calls of upstream's ``Runtime`` that a v1 task's
``setup`` / ``finalize`` and its scorers make: ``run`` / ``run_program`` (argv and env, an
upstream ``ProgramResult`` back), ``read``, ``write``, ``alive``. Relative paths are under
the runtime's work directory on both sides. Any other member of upstream's ``Runtime`` is an
``AttributeError`` naming it, rather than a call that would do something else here."""

from __future__ import annotations

from typing import Any

from .._core.runtime import Runtime


class V1Runtime:
    def __init__(self, ours: Runtime) -> None:
        self._ours = ours

    async def run(self, argv: list[str], env: dict[str, str] | None = None) -> Any:
        from verifiers.v1.runtimes import ProgramResult

        result = await self._ours.exec(argv, env=env or None)
        return ProgramResult(exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr)

    run_program = run

    async def read(self, path: str, max_bytes: int | None = None) -> bytes:
        return await self._ours.read(path, max_bytes)

    async def write(self, path: str, data: bytes | str) -> None:
        await self._ours.write(path, data)

    async def alive(self) -> bool:
        return await self._ours.alive()

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"upstream Runtime.{name} is not mapped onto rollout_ray's runtime; "
            "a v1 task here may call run, run_program, read, write and alive"
        )


def v1_runtime(runtime: Any) -> Any:
    """``runtime`` as upstream's calls, unless it is none (no runtime in this rollout)."""
    return V1Runtime(runtime) if isinstance(runtime, Runtime) else runtime
