"""The open phase of a ``Rollout``: the world built up to "runnable" (B6-B19).

The runtime (borrowed, or made by the factory and started), the task's setup, the session
served (in process, or by the interception for a program), the task's toolsets (in process,
or by a tool server), and the harness session given its context. ``Rollout`` inherits this;
its lifecycle reads top to bottom there (``open`` -> ``step`` -> ``close``), each phase's
detail in its own module: this one, ``phases.py`` (setup, finalize, scoring) and
``user_sim.py`` (the conversation with a simulated user).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from .._errors import HarnessError, SandboxError, TaskError, ToolsetError, UserSimulatorError, boundary
from .._record.trace import Trace
from .harness import Harness, HarnessContext, HarnessSession
from .interception import Interception
from .limits import RolloutTimeouts
from .phases import harness_data, run_setup
from .runtime import Runtime
from .session import RolloutSession
from .task import Task
from .tools import LocalTools, close_toolsets, open_toolsets
from .user_sim import UserSimulator

log = logging.getLogger("rollout_ray")


class RolloutOpen:
    """``Rollout.open`` and what it builds."""

    task: Task
    harness: Harness
    trace: Trace
    runtime: Runtime | None
    owns_runtime: bool
    has_user: bool
    timeouts: RolloutTimeouts
    session: RolloutSession
    interception: Interception
    harness_session: HarnessSession | None
    _runtime_factory: Callable[[str], Runtime] | None
    _runtime_kind: str | None
    _tool_server: Callable[..., Any] | None
    _local_tools: LocalTools | None
    _user: UserSimulator | None
    _stack: AsyncExitStack
    _opened: bool

    # Rollout's own (its lifecycle module): open records a failure and aborts on cancellation.
    fail: Callable[[BaseException], None]
    abort: Callable[[], Awaitable[None]]

    async def open(self) -> bool:
        """Build the world up to "runnable": runtime, setup, services, harness session.

        Returns:
            True when the harness session is ready; False when setup failed (recorded on the
            trace) or a hook stopped the trace during setup. Call ``close`` either way.

        Raises:
            ValueError: the borrowed runtime was already stopped by its owner.
        """
        self._opened = True
        self.trace.timing.boot.start = time.time()
        if self.runtime is None:
            try:
                self.runtime = self._own_runtime()
            except SandboxError as e:  # the runtime kind cannot run the task's image
                self.fail(e)
                return False
        elif self.runtime.stopped:
            raise ValueError(
                f"borrowed runtime {self.runtime.name!r} was already torn down by its owner; "
                "a rollout can only borrow a live runtime"
            )
        runtime = self.runtime
        self.trace.agent.runtime = runtime.info(borrowed=not self.owns_runtime)
        log.info(
            "rollout start: id=%s task=%s harness=%s runtime=%s",
            self.trace.id,
            self.task.data.idx,
            self.harness.id,
            runtime.type,
        )
        try:
            await self._open(runtime)
        except Exception as e:  # noqa: BLE001 - any failure to open is this rollout's, recorded on its trace
            self.fail(e)
            return False
        except BaseException:
            await self.abort()
            raise
        self.trace.timing.setup.end = self.trace.timing.agent.start = time.time()
        return not self.session.stopped

    def _own_runtime(self) -> Runtime:
        """The runtime factory's, given the task's image, kind and resources when it has them
        (a factory that takes none of them still makes a task's runtime that asks for none)."""
        assert self._runtime_factory is not None  # checked at construction
        data = self.task.data
        asked = {"image": data.image, "kind": data.runtime or self._runtime_kind, "resources": data.resources}
        return self._runtime_factory(self.trace.id, **{k: v for k, v in asked.items() if v is not None})

    async def _open(self, runtime: Runtime) -> None:
        with boundary(UserSimulatorError, "building the user simulator"):
            self._user = self.task.user_simulator()
        if self._user is not None and not self.harness.supports_resume:
            raise UserSimulatorError(
                f"task {type(self.task).__name__} brings a simulated user, but harness {self.harness.id!r} cannot "
                "resume a conversation (supports_resume is False): use ChatHarness or a harness that resumes"
            )
        if self.task.data.prompt is None and not self.has_user and self._user is None:
            raise TaskError(f"task {self.task.data.idx} has no prompt and no user to open the conversation")
        if self.owns_runtime:
            await runtime.start()
            self.trace.agent.runtime = runtime.info(borrowed=False)  # the id is known now
        await runtime.prepare_setup()
        self.trace.timing.boot.end = self.trace.timing.setup.start = time.time()
        await run_setup(self.task, self.harness, self.trace, runtime, self.timeouts)
        self.trace.agent.runtime = runtime.info(borrowed=not self.owns_runtime)  # its image, its setup snapshot
        with boundary(ToolsetError, "building tool servers"):
            toolsets = self.task.toolsets(self.task.config)
        slot = await self._stack.enter_async_context(self.interception.serve(self.session))
        # An in-process agent is not in the box: nothing in it needs the framework's routes.
        endpoint = slot.base_url + "/v1" if self.harness.in_process else runtime.host_url(slot.base_url) + "/v1"
        tool_urls = await self._serve_tools(toolsets, runtime, slot.state_secret)
        await runtime.prepare_execution([] if self.harness.in_process else [endpoint, *tool_urls.values()])
        if self.task.data.network_policy and "network" not in runtime.enforces:
            log.warning(
                "rollout %s: task %s asks for a network policy; a %r runtime does not enforce one (use SandboxRuntime)",
                self.trace.id,
                self.task.data.idx,
                runtime.type,
            )
        with boundary(HarnessError, "opening harness session"):
            data = await harness_data(self.task.data, self.harness, self.session, self.interception)
            if self.session.stopped:
                return
            ctx = HarnessContext(
                trace=self.trace,
                runtime=runtime,
                endpoint=endpoint,
                secret=slot.model_secret,
                data=data,
                client=self.interception.client(slot),
                tools=self._local_tools,
                tool_urls=tool_urls,
                tool_interception_url=self._tool_interception_url(runtime, slot.base_url),
                state_url=runtime.host_url(slot.base_url) + "/state" if self.harness.uses_state else None,
                state_secret=slot.state_secret if self.harness.uses_state else None,
                sync=functools.partial(self.interception.sync, self.session),  # no cycle back to self
            )
            self.harness_session = self.harness.session(ctx)

    async def _serve_tools(self, toolsets: list[Any], runtime: Runtime, state_secret: str) -> dict[str, str]:
        if not toolsets:
            return {}
        if self.harness.in_process:
            await open_toolsets(toolsets, runtime)
            self._stack.push_async_callback(close_toolsets, toolsets)
            self._local_tools = LocalTools(
                toolsets, runtime, on_call=self.trace.tool_calls.append, caller=self.trace.id, trace=self.trace
            )
            return {}
        if self._tool_server is None:
            raise ToolsetError(
                f"task {type(self.task).__name__} declares {len(toolsets)} tool server(s) but "
                "the rollout has no tool_server to run them; pass Rollout(tool_server=...)"
            )
        serving = self._tool_server(toolsets, runtime, state_secret, on_call=self.trace.tool_calls.append)
        return dict(await self._stack.enter_async_context(serving))

    def _tool_interception_url(self, runtime: Runtime, base_url: str) -> str | None:
        if self.harness.supports_tool_interception and (
            self.session.request_interceptors or self.session.request_stops
        ):
            return runtime.host_url(base_url) + "/tool"
        return None
