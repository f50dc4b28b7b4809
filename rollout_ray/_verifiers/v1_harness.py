"""A v1 taskset's own ``vf.Harness`` (a program harness) as our ``Harness``: its ``setup``
and ``launch`` run unchanged in our rollout's runtime (with upstream's calls,
``v1_runtime.py``), the program reaching the model through our proxy (``ctx.endpoint`` and
``ctx.secret``, what upstream hands it from its interception). A non-zero exit is our
``HarnessError``, as upstream's ``_check_result`` makes it; a ``@stop`` that ended the
rollout mid-program makes its exit expected, as upstream's.

The model name the program sends is ``model`` (our proxy serves whichever model the run
was given). A v1 harness that takes tools (``mcp_urls``) is given none: tasks with
toolsets are refused with a program harness (``task.refuse_unmapped``).
"""

from __future__ import annotations

from typing import Any

from .._core.harness import Harness, HarnessContext
from .._core.runtime import ProgramResult
from .v1_runtime import V1Runtime


class V1Harness(Harness):
    def __init__(self, upstream: Any, model: str = "model") -> None:
        super().__init__(upstream.config.id or type(upstream).__name__)
        self.upstream, self.model = upstream, model
        self.appends_system_prompt = bool(upstream.APPENDS_SYSTEM_PROMPT)  # type: ignore[misc]

    async def setup(self, runtime: Any) -> None:
        await self.upstream.setup(V1Runtime(runtime))

    async def launch(self, ctx: HarnessContext) -> ProgramResult:
        from verifiers.v1.clients import EvalClientConfig, ModelContext
        from verifiers.v1.task import TaskData

        data = TaskData.model_validate(ctx.data.model_dump(include={"idx", "name", "prompt", "system_prompt"}))
        model = ModelContext(model=self.model, client=EvalClientConfig(base_url=ctx.endpoint, api_key_var="_"))
        result = await self.upstream.launch(
            model, ctx.trace, V1Runtime(ctx.runtime), ctx.endpoint, ctx.secret, {}, data
        )
        return ProgramResult(result.exit_code, result.stdout or "", result.stderr or "")
