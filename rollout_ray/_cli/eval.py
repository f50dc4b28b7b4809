"""``rollout-ray eval``: one taskset, every task × n samples, into a run directory and a summary."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack
from types import ModuleType
from typing import Any

from .._core.executor import Executor
from .._core.harness import Harness
from .._core.limits import RolloutLimits
from .._core.model import Model
from .._core.task import Task
from .._driver.driver import Driver, EvalConfig, Progress, RunResult
from .._driver.local_executor import LocalExecutor
from .._errors import CorruptManifest, CorruptShard, ForeignShard, ResumeMismatch, RunInUse
from .._runtimes.host import runtime_kind
from .._serving.upstream import OpenAIModel
from .._simulated.config import SimulatedModelConfig
from .._simulated.server import SimulatedModelServer
from .summary import format_summary, summarize
from .taskset import load_taskset


def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("taskset", help="a .py file or a module defining tasks() and harness()")
    p.add_argument("--out", help="run directory for the manifest and Parquet shards (default: runs/<time>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out, skipping what is stored "
                   "(rollouts that failed for infrastructure or provider reasons are redone)")
    p.add_argument("--keep-failed", action="store_true",
                   help="with --resume: keep rollouts that failed for infrastructure or provider reasons")
    p.add_argument("--model-url", help="OpenAI-compatible base URL (default: the built-in simulated model)")
    p.add_argument("--model", default=None, help="model name sent upstream")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="variable holding the provider's key")
    p.add_argument("--samples", type=int, help="samples per task (n)")
    p.add_argument("--max-in-flight", type=int, help="rollouts running at once")
    p.add_argument("--max-turns", type=int, help="turn limit per rollout")
    p.add_argument("--limit", type=int, help="run only the first N tasks")
    p.add_argument("--executor", choices=["ray", "local"], default="ray",
                   help="ray: rollout actors (default); local: this process, no Ray")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a private local Ray on 127.0.0.1)")
    p.add_argument("--runtime", choices=["auto", "local", "sandbox"], default="auto",
                   help="runtime of each rollout: sandbox (bubblewrap: unprivileged, only the system "
                        "and the framework routes; the default where the machine runs one), local "
                        "(a private dir on the host, no isolation), auto (sandbox, else local)")
    p.add_argument("--actors", type=int, default=2, help="rollout actors (ray executor)")
    p.add_argument("--capacity", type=int, default=64, help="rollouts per actor at once (ray executor)")
    p.add_argument("--sim-ttft", type=float, default=0.05, help="simulated model: seconds to first token")
    p.set_defaults(run=_eval)


def eval_config(
    module: ModuleType,
    *,
    samples: int | None = None,
    max_in_flight: int | None = None,
    model_name: str | None = None,
    limits: Mapping[str, int | None] | None = None,
    sampling: Mapping[str, Any] | None = None,
    finalize: Mapping[str, Any] | None = None,
) -> EvalConfig:
    """The taskset's ``config`` (or the defaults) with the given settings laid over it.

    ``limits``, ``sampling`` and ``finalize`` override single fields of the taskset's own.
    """
    base: EvalConfig = getattr(module, "config", None) or EvalConfig()
    update: dict[str, Any] = {}
    if samples is not None:
        update["samples_per_task"] = samples
    if max_in_flight is not None:
        update["max_in_flight"] = max_in_flight
    if limits:
        update["limits"] = RolloutLimits(**{**vars(base.limits), **limits})
    if model_name is not None:
        update["model_name"] = model_name
    if sampling:
        update["sampling"] = {**base.sampling, **sampling}
    if finalize:
        update["finalize"] = {**base.finalize.model_dump(), **finalize}
    return EvalConfig.model_validate({**base.model_dump(), **update}) if update else base


def _config(module: ModuleType, args: argparse.Namespace) -> EvalConfig:
    limits = {"max_turns": args.max_turns} if args.max_turns is not None else None
    return eval_config(module, samples=args.samples, max_in_flight=args.max_in_flight,
                       model_name=args.model, limits=limits)


def _printer(stream: Any) -> Any:
    tty = stream.isatty()
    last = [0.0]

    def show(p: Progress) -> None:
        now = time.monotonic()
        if not tty and now - last[0] < 5:
            return
        last[0] = now
        total = f"/{p.total - p.skipped}" if p.total is not None else ""
        eta = f"{p.eta:.0f}s" if p.eta is not None else "?"
        line = (f"done {p.done}{total}  failed {p.failed}  in flight {p.in_flight}  "
                f"{p.rate:.1f} rollouts/s  ETA {eta}")
        stream.write(("\r" + line + "\033[K") if tty else line + "\n")
        stream.flush()

    return show


def make_executor(kind: str, module: ModuleType, *, actors: int = 2, capacity: int = 64,
                  address: str | None = None, runtime: str = "auto") -> Executor:
    """``"local"``: this process, no Ray; ``"ray"``: rollout actors (starts or joins Ray).

    ``runtime`` is the kind of the runtimes rollouts own (``"auto"``, ``"local"`` or
    ``"sandbox"``); when ``auto`` cannot have the sandbox, one line on stderr says why.
    """
    _, reason = runtime_kind(runtime)
    if reason is not None:
        print(f"rollout-ray: no sandbox on this machine ({reason}); rollouts run in LocalRuntime, "
              "isolated neither from each other nor from the host", file=sys.stderr)
    if kind == "local":
        return LocalExecutor(runtime=runtime)
    from .._ray.executor import RayExecutor

    return RayExecutor(actors=actors, capacity=capacity, address=address, runtime=runtime)


async def open_model(stack: AsyncExitStack, *, url: str | None, name: str | None, api_key_env: str,
                     simulated: SimulatedModelConfig | None = None) -> tuple[OpenAIModel, str, dict[str, Any]]:
    """The upstream model, where it is (for people), and what it is (for the manifest: the
    same for every run of the same model, so a resume can check it); closed with ``stack``.

    Without ``url``, a built-in simulated model server is started on ``stack`` with the
    ``simulated`` settings (default: ``SimulatedModelConfig()``).
    """
    if url:
        model = OpenAIModel(url, name=name, api_key=os.environ.get(api_key_env))
        where, record = url, {"url": url, "name": name}
    else:
        simulated = simulated or SimulatedModelConfig()
        server = await stack.enter_async_context(SimulatedModelServer(simulated))
        model = OpenAIModel(server.base_url, name=simulated.model_name)  # type: ignore[arg-type]
        where = f"built-in simulated model at {server.base_url}"
        record = {"simulated": simulated.model_dump(mode="json")}
    stack.push_async_callback(model.aclose)
    return model, where, record


async def drive(label: str, module: ModuleType, tasks: list[Task], harness: Harness, model: Model,
                executor: Executor, config: EvalConfig, out: str, *, resume: bool, where: str,
                manifest_config: dict[str, Any], keep_failed: bool = False) -> RunResult:
    """One eval run into ``out``, with eval's header and progress line on stderr."""
    print(f"{label}: {len(tasks)} tasks × {config.samples_per_task} samples, "
          f"model: {where}, run dir: {out}", file=sys.stderr)
    driver = Driver(tasks, harness, model, executor=executor, config=config, run_dir=out,
                    resume=resume, keep_failed=keep_failed, judge=getattr(module, "judge", None),
                    on_progress=_printer(sys.stderr), manifest_config=manifest_config)
    result = await driver.arun()
    print(file=sys.stderr)
    return result


async def _eval_async(args: argparse.Namespace) -> int:
    module = load_taskset(args.taskset)
    config = _config(module, args)
    tasks = list(module.tasks())
    if args.limit is not None:
        tasks = tasks[: args.limit]
    out = args.out or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
    async with AsyncExitStack() as stack:
        simulated = None if args.model_url else SimulatedModelConfig(ttft=args.sim_ttft)
        model, where, record = await open_model(stack, url=args.model_url, name=args.model,
                                                api_key_env=args.api_key_env, simulated=simulated)
        executor = await stack.enter_async_context(
            make_executor(args.executor, module, actors=args.actors, capacity=args.capacity,
                          address=args.address, runtime=args.runtime))
        result = await drive(f"eval {args.taskset}", module, tasks, module.harness(), model, executor,
                             config, out, resume=args.resume, where=where, keep_failed=args.keep_failed,
                             manifest_config={"taskset": args.taskset, "model": record})
    print(format_summary(summarize(result.samples, result.groups)))
    print(f"run dir: {out}")
    if result.status != "completed":
        print(f"run halted: {result.reason}", file=sys.stderr)
        return 3
    return 0


def _eval(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_eval_async(args))
    except (RunInUse, ResumeMismatch, CorruptManifest, CorruptShard, ForeignShard, FileExistsError) as e:
        print(f"rollout-ray eval: {e}", file=sys.stderr)
        return 2
