"""One run of a taskset as ``eval`` and ``sweep`` make it: the taskset's config with the
command's settings laid over it, the executor, the model (a URL, or the built-in simulated
one), driving the run with progress on stderr, and the package's version.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Mapping
from contextlib import AsyncExitStack
from types import ModuleType
from typing import Any, Literal

from .._core.harness import Harness
from .._core.limits import RolloutLimits, RolloutTimeouts
from .._core.model import Model
from .._core.task import Task
from .._driver.driver import Driver, EvalConfig, RunResult
from .._hosting.executor import Executor
from .._hosting.local_executor import LocalExecutor
from .._runtimes.host import runtime_kind
from .._serving.upstream import OpenAIModel
from .._simulated.config import SimulatedModelConfig
from .._simulated.model_server import SimulatedModelServer
from .progress_display import ProgressDisplay


def version() -> str:
    try:
        return importlib.metadata.version("rollout_ray")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


TOKEN_CAPTURES = ("auto", "vllm", "sglang", "off")
"""``--token-capture``: ``OpenAIModel``'s ``token_capture``, ``off`` for ``None``."""


def eval_config(
    module: ModuleType,
    *,
    samples: int | None = None,
    max_in_flight: int | Literal["auto"] | None = None,
    model_name: str | None = None,
    limits: Mapping[str, int | None] | None = None,
    sampling: Mapping[str, Any] | None = None,
    finalize: Mapping[str, Any] | None = None,
    timeouts: Mapping[str, float | None] | None = None,
    retries: int | None = None,
    retry_failed: bool | None = None,
) -> EvalConfig:
    """The taskset's ``config`` (or the defaults) with the given settings laid over it.

    ``limits``, ``timeouts``, ``sampling`` and ``finalize`` override single fields of the
    taskset's own.

    Raises:
        ValidationError: a setting out of range (``TypeError`` / ``ValueError`` of the limits).
    """
    base: EvalConfig = getattr(module, "config", None) or EvalConfig()
    update: dict[str, Any] = {}
    if samples is not None:
        update["samples_per_task"] = samples
    if max_in_flight is not None:
        update["max_in_flight"] = max_in_flight
    if limits:
        update["limits"] = RolloutLimits(**{**vars(base.limits), **limits})
    if timeouts:
        update["timeouts"] = RolloutTimeouts(**{**vars(base.timeouts), **timeouts})
    if model_name is not None:
        update["model_name"] = model_name
    if sampling:
        update["sampling"] = {**base.sampling, **sampling}
    if finalize:
        update["finalize"] = {**base.finalize.model_dump(), **finalize}
    if retries is not None:
        update["max_infra_retries"] = retries
    if retry_failed:
        update["retry_failed"] = True
    return EvalConfig.model_validate({**base.model_dump(), **update}) if update else base


def make_executor(
    kind: str,
    module: ModuleType,
    *,
    actors: int | None = None,
    capacity: int | None = None,
    address: str | None = None,
    runtime: str = "auto",
) -> Executor:
    """``"local"``: this process, no Ray; ``"ray"``: rollout actors (starts or joins Ray;
    ``actors=None``: one per CPU of the cluster).

    ``runtime`` is the kind of the runtimes rollouts own (``"auto"`` or a provider's
    name); when ``auto`` cannot have the sandbox, one line on stderr says why.
    """
    _, reason = runtime_kind(runtime)
    if reason is not None:
        print(
            f"rollout-ray: no sandbox on this machine ({reason}); rollouts run in LocalRuntime, "
            "isolated neither from each other nor from the host",
            file=sys.stderr,
        )
    if kind == "local":
        return LocalExecutor(runtime=runtime)
    from .._ray.ray_executor import RayExecutor

    return RayExecutor(actors=actors, capacity=capacity, address=address, runtime=runtime)


async def open_model(
    stack: AsyncExitStack,
    *,
    url: str | None,
    name: str | None,
    api_key_env: str,
    simulated: SimulatedModelConfig | None = None,
    token_capture: str = "auto",
) -> tuple[OpenAIModel, str, dict[str, Any]]:
    """The upstream model, where it is (for people), and what it is (for the manifest: the
    same for every run of the same model, so a resume can check it); closed with ``stack``.

    Without ``url``, a built-in simulated model server is started on ``stack`` with the
    ``simulated`` settings (default: ``SimulatedModelConfig()``: vLLM's info route and shapes).
    ``token_capture`` is one of ``TOKEN_CAPTURES``.
    """
    capture: Any = None if token_capture == "off" else token_capture
    record = model_record(url=url, name=name, simulated=simulated)
    if url:
        model = OpenAIModel(url, name=name, api_key=os.environ.get(api_key_env), token_capture=capture)
        where = url
    else:
        simulated = simulated or SimulatedModelConfig()
        server = await stack.enter_async_context(SimulatedModelServer(simulated))
        model = OpenAIModel(server.base_url, name=simulated.model_name, token_capture=capture)  # type: ignore[arg-type]
        where = f"built-in simulated model at {server.base_url}"
    stack.push_async_callback(model.aclose)
    return model, where, record


def model_record(*, url: str | None, name: str | None, simulated: SimulatedModelConfig | None = None) -> dict[str, Any]:
    """What the manifest records of the model (``open_model``'s third value), known before it
    is opened: a resume is checked against it before anything starts."""
    if url:
        return {"url": url, "name": name}
    return {"simulated": (simulated or SimulatedModelConfig()).model_dump(mode="json")}


async def drive(
    label: str,
    module: ModuleType,
    tasks: list[Task],
    harness: Harness,
    model: Model,
    executor: Executor,
    config: EvalConfig,
    out: str,
    *,
    resume: bool,
    where: str,
    manifest_config: dict[str, Any],
    keep_failed: bool = False,
    announce: bool = True,
    overwrite: bool = False,
    started: float | None = None,
) -> RunResult:
    """One eval run into ``out``, with eval's header (unless ``announce`` is off: the caller
    printed it) and progress on stderr, its wall clock counted from ``started`` (monotonic;
    default: now)."""
    if announce:
        print(header(label, tasks, config, where, out), file=sys.stderr)
    display = ProgressDisplay(sys.stderr, started=started)
    driver = Driver(
        tasks,
        harness,
        model,
        executor=executor,
        config=config,
        run_dir=out,
        resume=resume,
        overwrite=overwrite,
        keep_failed=keep_failed,
        judge=getattr(module, "judge", None),
        on_progress=display.update,
        manifest_config=manifest_config,
    )
    try:
        return await driver.arun()
    finally:
        display.close()


def header(label: str, tasks: list[Task], config: EvalConfig, where: str, out: str) -> str:
    tasks_text = f"{len(tasks)} tasks"
    if config.max_groups is not None and config.max_groups < len(tasks):
        tasks_text = f"{config.max_groups} groups from {len(tasks)} tasks (max_groups)"
    return f"{label}: {tasks_text} × {config.samples_per_task} samples, model: {where}, run dir: {out}"
