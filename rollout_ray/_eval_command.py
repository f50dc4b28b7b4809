"""``rollout-ray eval`` and ``rollout-ray report``."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import os
import sys
import time
from contextlib import AsyncExitStack
from types import ModuleType
from typing import Any

from ._driver import Driver, EvalConfig, Progress
from ._executor import Executor, LocalExecutor
from ._limits import RolloutLimits
from ._simulated_model import SimulatedModelConfig, SimulatedModelServer
from ._summary import format_summary, plot, summarize
from ._upstream import OpenAIModel


def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("taskset", help="a .py file or a module defining tasks() and harness()")
    p.add_argument("--out", help="run directory for the manifest and Parquet shards (default: runs/<time>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out, skipping what is stored")
    p.add_argument("--model-url", help="OpenAI-compatible base URL (default: the built-in simulated model)")
    p.add_argument("--model", default=None, help="model name sent upstream")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="variable holding the provider's key")
    p.add_argument("--samples", type=int, help="samples per task (n)")
    p.add_argument("--max-in-flight", type=int, help="rollouts running at once")
    p.add_argument("--max-turns", type=int, help="turn limit per rollout")
    p.add_argument("--limit", type=int, help="run only the first N tasks")
    p.add_argument("--executor", choices=["ray", "local"], default="ray",
                   help="ray: rollout actors (default); local: this process, no Ray")
    p.add_argument("--address", help="Ray cluster address (default: start or join a local Ray)")
    p.add_argument("--actors", type=int, default=2, help="rollout actors (ray executor)")
    p.add_argument("--capacity", type=int, default=64, help="rollouts per actor at once (ray executor)")
    p.add_argument("--sim-ttft", type=float, default=0.05, help="simulated model: seconds to first token")
    p.set_defaults(run=_eval)


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run directory written by eval")
    p.add_argument("--plot", help="PNG path (default: RUN_DIR/report.png)")
    p.set_defaults(run=_report)


def load_taskset(ref: str) -> ModuleType:
    """Import a taskset from a file path or a module name."""
    if ref.endswith(".py") or os.path.sep in ref:
        if not os.path.exists(ref):
            raise SystemExit(f"rollout-ray eval: no such file: {ref}")
        name = "taskset_" + os.path.splitext(os.path.basename(ref))[0]
        spec = importlib.util.spec_from_file_location(name, ref)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(ref)
    for needed in ("tasks", "harness"):
        if not callable(getattr(module, needed, None)):
            raise SystemExit(f"rollout-ray eval: {ref} must define {needed}() (see `rollout-ray eval --help`)")
    return module


def _config(module: ModuleType, args: argparse.Namespace) -> EvalConfig:
    base: EvalConfig = getattr(module, "config", None) or EvalConfig()
    update: dict[str, Any] = {}
    if args.samples is not None:
        update["samples_per_task"] = args.samples
    if args.max_in_flight is not None:
        update["max_in_flight"] = args.max_in_flight
    if args.max_turns is not None:
        update["limits"] = RolloutLimits(**{**vars(base.limits), "max_turns": args.max_turns})
    if args.model is not None:
        update["model_name"] = args.model
    return EvalConfig.model_validate({**base.model_dump(), **update}) if update else base


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


def _executor(args: argparse.Namespace, module: ModuleType) -> Executor:
    if args.executor == "local":
        return LocalExecutor()
    import ray

    from ._ray_executor import RayExecutor

    ray.cloudpickle.register_pickle_by_value(module)  # workers cannot import a taskset file
    return RayExecutor(actors=args.actors, capacity=args.capacity, address=args.address)


async def _eval_async(args: argparse.Namespace) -> int:
    module = load_taskset(args.taskset)
    config = _config(module, args)
    tasks = list(module.tasks())
    if args.limit is not None:
        tasks = tasks[: args.limit]
    out = args.out or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
    async with AsyncExitStack() as stack:
        if args.model_url:
            model = OpenAIModel(args.model_url, name=args.model, api_key=os.environ.get(args.api_key_env))
            where = args.model_url
        else:
            server = await stack.enter_async_context(
                SimulatedModelServer(SimulatedModelConfig(ttft=args.sim_ttft)))
            model = OpenAIModel(server.base_url, name="simulated")  # type: ignore[arg-type]
            where = f"built-in simulated model at {server.base_url}"
        executor = await stack.enter_async_context(_executor(args, module))
        print(f"eval {args.taskset}: {len(tasks)} tasks × {config.samples_per_task} samples, "
              f"model: {where}, run dir: {out}", file=sys.stderr)
        driver = Driver(tasks, module.harness(), model, executor=executor, config=config, run_dir=out,
                        resume=args.resume, judge=getattr(module, "judge", None),
                        on_progress=_printer(sys.stderr),
                        manifest_config={"taskset": args.taskset, "model": where})
        result = await driver.arun()
        await model.aclose()
    print(file=sys.stderr)
    print(format_summary(summarize(result.samples, result.groups)))
    print(f"run dir: {out}")
    if result.status != "completed":
        print(f"run halted: {result.reason}", file=sys.stderr)
        return 3
    return 0


def _eval(args: argparse.Namespace) -> int:
    return asyncio.run(_eval_async(args))


def _report(args: argparse.Namespace) -> int:
    from ._finalize import FinalizeConfig, finalize
    from ._store import read_manifest, read_run

    if not os.path.isdir(args.run_dir):
        raise SystemExit(f"rollout-ray report: no such run directory: {args.run_dir}")
    stored = read_run(args.run_dir)
    if not stored.num_rows:
        raise SystemExit(f"rollout-ray report: {args.run_dir} holds no rollouts yet")
    recorded = read_manifest(args.run_dir).config.get("eval", {}).get("finalize")
    whole = finalize(stored, FinalizeConfig.model_validate(recorded) if recorded else FinalizeConfig())
    print(format_summary(summarize(whole.samples, whole.groups)))
    print(f"plot: {plot(whole.samples, args.plot or os.path.join(args.run_dir, 'report.png'))}")
    return 0
