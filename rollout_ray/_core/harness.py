"""Harnesses: the agent program, and one rollout's session onto it.

A ``Harness`` is a stateless descriptor: it provisions itself into a runtime (``setup``),
opens a ``HarnessSession`` per rollout, scores its own ``@metric``s and cleans up. A session
runs the agent in *segments*: ``turn(None)`` launches it, ``turn(messages)`` resumes it with
new user messages; each segment runs until the program yields control, and its exit code is
checked (B26). All model traffic goes to ``ctx.endpoint`` with ``ctx.secret`` as the bearer,
or, in process, through ``ctx.client``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .._errors import HarnessError, SandboxError, boundary
from .._record.messages import Message
from .._record.trace import Trace
from .hooks import discover, requires
from .interception import ChatClient
from .runtime import ProgramResult, Runtime
from .scoring import run_metrics, seed
from .task import TaskData
from .tools import LocalTools

log = logging.getLogger("rollout_ray")

OUTPUT_TAIL = 2000
"""Characters of a failed program's output quoted in its HarnessError."""


async def _in_sync() -> None:
    """The trace is the live one: there is nothing to bring back."""


@dataclass
class HarnessContext:
    """Everything a harness session needs to run one rollout.

    ``trace`` is the rollout's own. When the rollout's model boundary is served in another
    process (a program's proxy on Ray), turns that program made reach ``trace`` only at
    ``await ctx.sync()``; the harness session calls it before judging a failed segment, and
    a harness that reads the trace mid-segment (``trace.stopped``, ``trace.tool_calls``)
    calls it first. In process it does nothing.
    """

    trace: Trace
    runtime: Runtime
    endpoint: str
    """OpenAI-compatible base URL of the rollout's interception (ends in ``/v1``)."""
    secret: str
    """Bearer token of the rollout's model routes."""
    data: TaskData
    """The task data, with the prompt as rewritten by request interceptors."""
    client: ChatClient | None = None
    """In-process route to the model boundary, when the interception offers one."""
    tools: LocalTools | None = None
    """The task's tools in process (an ``in_process`` harness's); ``tool_urls`` otherwise."""
    tool_urls: dict[str, str] = field(default_factory=dict)
    tool_interception_url: str | None = None
    """The tool gate (``POST``, model secret; §5.3), when the harness declares
    ``supports_tool_interception`` and the task has a request ``@intercept`` or ``@stop``."""
    state_url: str | None = None
    """The rollout's ``/state`` route (``GET`` / ``PUT``), when the harness declares ``uses_state``."""
    state_secret: str | None = None
    """Bearer of ``state_url`` (and ``/task``), when the harness declares ``uses_state``."""
    sync: Callable[[], Awaitable[None]] = _in_sync
    """Bring ``trace`` up to date with the serving side (see the class docstring)."""


class Harness:
    """An agent program. Subclass and implement ``launch`` (and ``resume`` to support users).

    Class flags:
        appends_system_prompt: the harness passes ``system_prompt`` to the model itself;
            otherwise it is folded into the user prompt.
        supports_resume: ``resume`` can continue a conversation with new user messages.
        supports_tool_interception: the harness asks the tool gate before it runs each tool
            call (``ctx.tool_interception_url``, §5.3).
        uses_state: the harness reads and writes ``trace.state`` over ``/state``
            (``ctx.state_url``, ``ctx.state_secret``). The state secret lets its holder rewrite
            what rewards read: declare it only for a program trusted as the task's own tools are.
        in_process: the agent loop runs in the rollout's own process and reaches the model
            and the tools only through ``ctx.client`` and ``ctx.tools``: the rollout then
            serves its session and tools in process (no proxy, no server, one owner of the
            trace), whatever interception it was given for programs.
    """

    appends_system_prompt: ClassVar[bool] = True
    supports_resume: ClassVar[bool] = False
    supports_tool_interception: ClassVar[bool] = False
    uses_state: ClassVar[bool] = False
    in_process: bool = False

    def __init__(self, id: str | None = None) -> None:
        self.id = id or type(self).__name__

    async def setup(self, runtime: Runtime) -> None:
        """Provision the harness into the runtime."""

    def resolve_prompt(self, data: TaskData) -> tuple[str | None, Any]:
        """``(system prompt, prompt)`` as this harness will send them.

        A harness that cannot append a system prompt gets it folded into a string prompt
        (``system + blank line + prompt``), with a warning.
        """
        system, prompt = data.system_prompt, data.prompt
        if system is not None and not self.appends_system_prompt and isinstance(prompt, str):
            log.warning("harness %s cannot append a system prompt; folding it into the prompt", self.id)
            return None, f"{system}\n\n{prompt}"
        return system, prompt

    def session(self, ctx: HarnessContext) -> HarnessSession:
        """A session onto one run of this harness."""
        return HarnessSession(self, ctx)

    async def launch(self, ctx: HarnessContext) -> ProgramResult:
        """Run the first segment; return the program's result."""
        raise NotImplementedError(f"{type(self).__name__}.launch is not implemented")

    async def resume(self, ctx: HarnessContext, messages: Sequence[Message]) -> ProgramResult:
        """Continue the conversation with the caller's ``messages``."""
        raise HarnessError(f"harness '{self.id}' cannot resume: it does not support users")

    async def score(self, trace: Trace, runtime: Runtime | None = None, task: TaskData | None = None) -> None:
        """Seed and run the harness's own ``@metric``s (harnesses have no rewards, B48).

        Metrics receive ``task`` (the task data), ``trace`` and ``runtime`` by parameter name.
        """
        hooks = discover(self, "metric")
        if runtime is None:
            hooks = [h for h in hooks if not requires(h.fn, "runtime")]
        available: dict[str, Any] = {"task": task, "trace": trace, "runtime": runtime}
        with boundary(HarnessError, f"harness '{self.id}' metric"):
            seed(trace, metrics=[h.name for h in hooks])
            await run_metrics(trace, hooks, available)

    async def cleanup(self, trace: Trace, runtime: Runtime) -> None:
        """Remove per-rollout harness state from the runtime; must be idempotent."""


class HarnessSession:
    """One rollout's handle onto a harness run. ``close`` is idempotent."""

    def __init__(self, harness: Harness, ctx: HarnessContext) -> None:
        self.harness = harness
        self.ctx = ctx
        self.closed = False

    async def turn(self, messages: Sequence[Message] | None = None) -> None:
        """Run one segment: launch when ``messages`` is None, else resume with them.

        Raises:
            HarnessError: the program failed or exited non-zero.
            SandboxError: the runtime died under the program.
        """
        if self.closed:
            raise HarnessError(f"harness '{self.harness.id}' session is closed")
        with boundary(HarnessError, f"harness '{self.harness.id}'"):
            if messages is None:
                result = await self.harness.launch(self.ctx)
            else:
                result = await self.harness.resume(self.ctx, messages)
            await self._check(result)

    async def _check(self, result: ProgramResult) -> None:
        if result.exit_code == 0:
            return
        await self.ctx.sync()  # a refused turn may be why it failed: is the trace stopped?
        if self.ctx.trace.stopped:
            return
        tail = (result.stderr or result.stdout or "<no output>")[-OUTPUT_TAIL:]
        if not await self.ctx.runtime.alive():
            raise SandboxError(f"runtime died under harness '{self.harness.id}' (exit {result.exit_code}): {tail}")
        raise HarnessError(f"harness '{self.harness.id}' exited {result.exit_code}: {tail}")

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self._close()

    async def _close(self) -> None:
        """Release transport state (a live process, a connection); override as needed."""
