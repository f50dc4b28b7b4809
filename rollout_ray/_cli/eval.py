"""``rollout-ray eval``: one taskset, every task × n samples, into a run directory and a summary."""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import ModuleType

import pyarrow.compute as pc
from pydantic import ValidationError

from .._core.harness import Harness
from .._core.task import Task
from .._driver.driver import EvalConfig, RunResult
from .._errors import (
    CorruptRun,
    ProviderError,
    RayUnreachable,
    ResumeMismatch,
    RunInUse,
    UsageError,
)
from .._harnesses.agents import AgentHarness
from .._record.store import stored_outcomes
from .._serving.upstream import OpenAIModel
from .._simulated.config import SimulatedModelConfig
from .arguments import one_line
from .checks import check_address, check_api_key, check_out, check_pass_k, check_resume, check_sampling
from .claim import Claim
from .drive import drive, eval_config, header, make_executor, model_record, open_model
from .eval_arguments import DEFAULT_API_KEY_ENV, add_eval_flags
from .interrupt import Signals
from .protections import (
    budgets_line,
    check_runtimes,
    kinds_asked,
    nodes_line,
    runtime_line,
    with_finite_defaults,
)
from .runs import RUNS_ROOT, continue_command, latest_run, served_model
from .summary import format_summary, stored_token_rows, summarize
from .taskset_loader import import_taskset, import_v1_taskset, taskset_harness, taskset_tasks
from .warmup import warm_up


def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    add_eval_flags(p)
    p.set_defaults(run=_eval)


_LIMIT_FLAGS = {
    "max_turns": "max_turns",
    "max_tokens_total": "max_total_tokens",
    "max_input_tokens": "max_input_tokens",
    "max_output_tokens": "max_output_tokens",
}
_SAMPLING_FLAGS = ("temperature", "top_p", "max_tokens", "seed")


def _config(module: ModuleType, args: argparse.Namespace) -> EvalConfig:
    limits = {field: getattr(args, flag) for flag, field in _LIMIT_FLAGS.items() if getattr(args, flag) is not None}
    timeouts = {
        phase: getattr(args, f"timeout_{phase}")
        for phase in ("setup", "agent")
        if getattr(args, f"timeout_{phase}") is not None
    }
    sampling = {
        **(args.sampling or {}),
        **{k: getattr(args, k) for k in _SAMPLING_FLAGS if getattr(args, k) is not None},
    }
    try:
        return eval_config(
            module,
            samples=args.samples,
            max_in_flight=args.max_in_flight,
            model_name=args.model,
            limits=limits,
            sampling=sampling,
            timeouts=timeouts,
            retries=args.retries,
            retry_failed=args.retry_failed,
            finalize={"pass_k": args.pass_k} if args.pass_k else None,
        )
    except ValidationError as e:
        raise UsageError(f"invalid settings (with the taskset's config): {one_line(e)}") from None
    except (TypeError, ValueError) as e:
        raise UsageError(f"invalid settings (with the taskset's config): {e}") from None


@dataclass
class _Plan:
    """What an eval will run, every part of it checked before anything starts."""

    module: ModuleType
    tasks: list[Task]
    harness: Harness
    config: EvalConfig
    out: str
    model_name: str | None
    defaulted: list[str]
    """The budgets per rollout that are the CLI's defaults (``protections``)."""
    claim: Claim
    """``out``, locked from the checks until the driver takes it."""


def _plan(args: argparse.Namespace) -> _Plan:
    """Raises ``UsageError`` for anything wrong: before Ray starts or a file is written."""
    if args.verifiers and args.taskset:
        raise UsageError("give a taskset or --verifiers REF, not both")
    if args.verifiers:
        module, args.taskset = import_v1_taskset(args.verifiers, args.limit), args.verifiers
    elif args.taskset:
        module = import_taskset(args.taskset)
    else:
        raise UsageError("give a taskset (a .py file or a module defining tasks() and harness()), or --verifiers REF")
    tasks = taskset_tasks(module, args.taskset, args.limit)
    harness = taskset_harness(module, args.taskset)
    check_sampling(args.sampling)
    config, defaulted = with_finite_defaults(_config(module, args))
    check_pass_k(config, given=args.pass_k is not None)
    check_api_key(args.api_key_env, model_url=args.model_url)
    if args.out:
        out = args.out
    elif args.resume:
        out = latest_run(args.taskset)
        print(f"resuming {out}", file=sys.stderr)
    else:
        out = os.path.join(RUNS_ROOT, time.strftime("%Y%m%d-%H%M%S"))
    check_out(out, resume=args.resume, overwrite=args.overwrite)
    claim = Claim(out)  # from here a second eval on out is refused, and ctl says this one is starting
    claim.take()
    try:
        model_name = args.model
        if args.model_url and not args.model and config.model_name is None:
            model_name = served_model(args.model_url, os.environ.get(_api_key_env(args)))
            config = config.model_copy(update={"model_name": model_name})
        check_address(args.executor, args.address)
        check_runtimes(args.runtime, tasks, config, remote=_remote(args))
        if args.resume:
            check_resume(
                out,
                {
                    "taskset": args.taskset,
                    "eval": config.model_dump(mode="json"),
                    "model": model_record(url=args.model_url, name=model_name, simulated=_simulated(args)),
                },
            )
    except BaseException:
        claim.close()  # and the directory it made goes
        raise
    _say_agent_install(harness)
    return _Plan(module, tasks, harness, config, out, model_name, defaulted, claim)


def _say_agent_install(harness: Harness) -> None:
    """An agent preset installs itself inside the first rollout's setup on each node (npm or
    pip, hundreds of MB): minutes in which the bar showed nothing. Said once, before the run."""
    fetch = harness.missing() if isinstance(harness, AgentHarness) else None
    if fetch:
        print(
            f"rollout-ray eval: this machine has not installed the agent yet ({fetch}); the first rollout "
            "on each node that lacks it installs it (minutes: its rollouts wait meanwhile)",
            file=sys.stderr,
        )


def _simulated(args: argparse.Namespace) -> SimulatedModelConfig | None:
    """The built-in simulated model's settings, without --model-url."""
    return None if args.model_url else SimulatedModelConfig(ttft=args.sim_ttft)


def _api_key_env(args: argparse.Namespace) -> str:
    return args.api_key_env or DEFAULT_API_KEY_ENV


async def _run(
    args: argparse.Namespace, plan: _Plan, signals: Signals, started: float
) -> tuple[RunResult, dict[str, float | None], dict[str, str | None]]:
    """The run, its clock since ``started``: ``start`` (the model, Ray and the actors, up to
    the driver's start), ``rollouts`` (the driver's run) and ``rate`` (rollouts run in this
    session per second of ``rollouts``), and how its tokens were captured (the summary's
    ``token_capture``)."""
    async with AsyncExitStack() as stack:
        model, where, record = await open_model(
            stack,
            url=args.model_url,
            name=plan.model_name,
            api_key_env=_api_key_env(args),
            simulated=_simulated(args),
            token_capture=args.token_capture,
        )
        probing = asyncio.create_task(_capture_dialect(model))  # asked while Ray starts
        stack.callback(probing.cancel)
        label = f"eval {args.taskset}"
        print(header(label, plan.tasks, plan.config, where, plan.out), file=sys.stderr)  # before Ray's wait
        executor = await stack.enter_async_context(
            make_executor(
                args.executor,
                plan.module,
                actors=args.actors,
                capacity=args.capacity,
                address=args.address,
                runtime=args.runtime,
            )
        )
        if _remote(args):  # this machine's check said nothing of the cluster's nodes: ask them
            for kind in kinds_asked(args.runtime, plan.tasks, plan.config):
                await _say_nodes_lacking(kind)
        signals.install()
        what = await warm_up(executor, programs=not plan.harness.in_process)
        if what is not None:
            print(f"warmup {time.monotonic() - started:.1f}s: Ray, {what}", file=sys.stderr)
        driving, since = time.monotonic(), time.time()
        plan.claim.hand_over()  # the driver locks the run as it opens it
        result = await drive(
            label,
            plan.module,
            plan.tasks,
            plan.harness,
            model,
            executor,
            plan.config,
            plan.out,
            resume=args.resume,
            overwrite=args.overwrite,
            where=where,
            keep_failed=args.keep_failed,
            manifest_config={"taskset": args.taskset, "model": record},
            announce=False,
            started=started,
        )
        rollouts = time.monotonic() - driving
        capture = {"capture": args.token_capture, "dialect": await probing}
        timing = {"start": driving - started, "rollouts": rollouts, "rate": _rate(result, since, rollouts)}
        return result, timing, capture


def _remote(args: argparse.Namespace) -> bool:
    """Whether rollouts run on a cluster this machine does not start (its nodes are not this one)."""
    return args.executor == "ray" and bool(args.address or os.environ.get("RAY_ADDRESS"))


async def _say_nodes_lacking(kind: str) -> None:
    from .._ray.node_check import nodes_lacking

    line = nodes_line(kind, *await nodes_lacking(kind))
    if line is not None:
        print(line, file=sys.stderr)


async def _capture_dialect(model: OpenAIModel) -> str | None:
    """The dialect the model's calls capture tokens in; ``"unknown"``: it could not be asked."""
    try:
        return await model.capture_dialect()
    except ProviderError:
        return "unknown"


async def _eval_async(args: argparse.Namespace, plan: _Plan, signals: Signals) -> int:
    signals.install()
    started = time.monotonic()
    try:
        result, timing, capture = await _run(args, plan, signals, started)
    except asyncio.CancelledError:
        if signals.received is None:
            raise
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
        return _interrupted(args, plan, signals.received)
    summary = summarize(
        result.samples,
        result.groups,
        timing={**timing, "wall": time.monotonic() - started},
        status=result.status,
        reason=result.reason,
    )
    summary.update(
        token_rows=stored_token_rows(plan.out),
        token_capture=capture,
        protections=[budgets_line(plan.config, plan.defaulted), runtime_line(args.runtime, plan.tasks, plan.config)],
    )
    print(format_summary(summary))
    print(f"run dir: {plan.out}")
    if result.status != "completed":
        print(
            f"rollout-ray eval: run halted: {result.reason}; continue with: {continue_command(args.argv, plan.out)}",
            file=sys.stderr,
        )
        return HALTED
    if summary["rollouts"] and not summary["ok"]:
        print(
            f"rollout-ray eval: every rollout failed ({summary['failed']} of {summary['rollouts']}); "
            "see the error types above, or `rollout-ray view` the run",
            file=sys.stderr,
        )
        return ALL_FAILED
    judged, first = summary["judge_failures"]
    if judged:
        # rescore stores the fixed judge's columns (a score version); finalize(read_run(...)) only computes them
        print(
            f"rollout-ray eval: the judge failed on {judged} of {summary['groups']} groups ({first}); the "
            f"rollouts are stored: fix the judge, then `rollout-ray rescore {shlex.quote(plan.out)}` stores its "
            "columns, without a model",
            file=sys.stderr,
        )
        return JUDGE_FAILED
    return 0


def _rate(result: RunResult, since: float, seconds: float) -> float | None:
    """Rollouts per second of this session's driving: those started ``since`` (epoch seconds;
    a resume's stored rollouts are not counted) over ``seconds``."""
    ran = result.samples.num_rows
    if "started_at" in result.samples.column_names and ran:
        ran = int(pc.sum(pc.greater_equal(result.samples["started_at"], since)).as_py() or 0)
    return ran / seconds if seconds > 0 else None


HALTED = 3
"""Exit code of a run the circuit breaker halted."""
ALL_FAILED = 1
"""Exit code of a run whose every rollout failed."""
JUDGE_FAILED = 4
"""Exit code of a run whose judge failed on a group (the rollouts are stored, its columns not)."""


def _interrupted(args: argparse.Namespace, plan: _Plan, signum: int) -> int:
    total = len(plan.tasks) * plan.config.samples_per_task
    try:
        stored = len(stored_outcomes(plan.out)) if os.path.isdir(plan.out) else 0
    except Exception:  # noqa: BLE001 - the count is a courtesy; the line must still be printed
        stored = 0
    # A group is stored whole, when its last sample finishes: the bar's count of finished
    # rollouts can exceed this one, and a user must know those are not lost by mistake.
    unfinished = (
        " (finished samples of groups not yet complete are not stored: the resume runs them again)"
        if stored < total and plan.config.samples_per_task > 1
        else ""
    )
    print(
        f"\ninterrupted: {stored} of {total} stored{unfinished}; continue with: "
        f"{continue_command(args.argv, plan.out)}",
        file=sys.stderr,
    )
    return 128 + signum


def _eval(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
    except RayUnreachable as e:
        print(f"rollout-ray eval: {e}; check {'--address' if args.address else 'RAY_ADDRESS'}", file=sys.stderr)
        return 2
    signals = Signals()
    try:
        return asyncio.run(_eval_async(args, plan, signals))
    except (RunInUse, ResumeMismatch, CorruptRun, FileExistsError, RayUnreachable) as e:
        print(f"rollout-ray eval: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the event loop took the signal over
        return _interrupted(args, plan, signal.SIGINT)
    finally:
        plan.claim.close()
