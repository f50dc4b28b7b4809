"""One row of bench_cost.py, in its own process (so its CPU, memory and start-up are its own).

    python benchmarks/_cost_worker.py '{"executor": "ray", "kind": "single", ...}'

It talks to bench_cost.py on its standard streams: ``@@T name epoch`` (a timestamp),
``@@PROG done in_flight failed epoch`` (driver progress), ``@@MARK name`` followed by a wait
for one line on stdin (bench_cost.py snapshots the CPU of every process meanwhile, so the
measured window is exactly the run between ``@@MARK start`` and ``@@MARK end``), and last
``@@RESULT {json}``.

Executors:

- ``floor``: a bare aiohttp client loop: one ``ClientSession`` (``TCPConnector(limit=C)``), C
  coroutines pulling rollouts from one iterator; a rollout is one chat completion (single) or
  a completion offering an ``add`` tool, the tool executed here, and a second completion with
  its result (tool). Nothing of rollout_ray is imported.
- ``local``: ``Driver`` + ``LocalExecutor`` over examples/arith.py (single) or
  examples/calc_tool.py (tool), run directory in a temporary directory.
- ``ray``: the same with ``RayExecutor(actors=A, capacity=K)`` on a private local Ray started
  here (``ray.init`` timed alone), warmed up by one run of ``warmup`` rollouts.

Every executor gets the same warm-up run before the measured run (not measured; its first
model call dates the cold start).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {"single": ROOT / "examples" / "arith.py", "tool": ROOT / "examples" / "calc_tool.py"}


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def stamp(name: str) -> None:
    emit(f"@@T {name} {time.time():.6f}")


def mark(name: str) -> None:
    """Tell bench_cost.py, and wait until it has taken its snapshot."""
    emit(f"@@MARK {name}")
    if not sys.stdin.readline():
        raise SystemExit("bench_cost.py went away")


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- floor: a bare aiohttp client loop ------------------------------------------------------------

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def floor_prompts(kind: str, tasks: int, group: int) -> list[tuple[list[dict[str, Any]], int]]:
    """The prompts of examples/arith.py (single) or examples/calc_tool.py (tool), drawn the same
    way (same seeds), each repeated ``group`` times; without importing rollout_ray."""
    out = []
    if kind == "single":
        rng = random.Random(0)
        for _ in range(tasks):
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            messages = [
                {"role": "system", "content": "Answer with the number only."},
                {"role": "user", "content": f"What is {a} + {b}?"},
            ]
            out += [(messages, a + b)] * group
    else:
        rng = random.Random(1)
        for _ in range(tasks):
            a, b = rng.randint(100, 999), rng.randint(100, 999)
            messages = [{"role": "user", "content": f"What is {a} + {b}? Use the calculator."}]
            out += [(messages, a + b)] * group
    return out


async def floor_run(
    session: Any, url: str, kind: str, prompts: list[tuple[list[dict[str, Any]], int]], concurrency: int
) -> dict[str, Any]:
    failed = correct = 0
    endpoint = url.rstrip("/") + "/chat/completions"

    async def complete(body: dict[str, Any]) -> dict[str, Any]:
        async with session.post(endpoint, json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}")
            data = await r.json()
        return data["choices"][0]["message"]

    async def one(messages: list[dict[str, Any]], answer: int) -> bool:
        if kind == "single":
            msg = await complete({"model": "simulated", "messages": messages})
        else:
            msg = await complete({"model": "simulated", "messages": messages, "tools": [ADD_TOOL]})
            call = msg["tool_calls"][0]
            args = json.loads(call["function"]["arguments"])
            result = int(args["a"]) + int(args["b"])  # the calculator, executed here
            msg = await complete(
                {
                    "model": "simulated",
                    "tools": [ADD_TOOL],
                    "messages": [
                        *messages,
                        {"role": "assistant", "content": None, "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": call["id"], "content": str(result)},
                    ],
                }
            )
        return (msg.get("content") or "").strip() == str(answer)

    it = iter(prompts)

    async def loop() -> None:
        nonlocal failed, correct
        for messages, answer in it:
            try:
                ok = await one(messages, answer)  # (not "correct += await ...": read before the await)
            except Exception:  # noqa: BLE001 - a failed rollout is counted, the run goes on
                failed += 1
            else:
                correct += ok

    await asyncio.gather(*(loop() for _ in range(min(concurrency, len(prompts)))))
    return {"failed": failed, "done": len(prompts), "reward": correct / max(1, len(prompts))}


async def floor(spec: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    stamp("imported")
    kind, group, c, url = spec["kind"], spec["group"], spec["concurrency"], spec["url"]
    tasks = math.ceil(spec["n"] / group)
    prompts = floor_prompts(kind, tasks, group)
    warm = floor_prompts(kind, math.ceil(spec["warmup"] / group), group)
    stamp("executor_start")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c)) as session:
        t0 = time.perf_counter()
        w = await floor_run(session, url, kind, warm, c)
        warm_wall = time.perf_counter() - t0
        mark("start")
        t0 = time.perf_counter()
        r = await floor_run(session, url, kind, prompts, c)
        wall = time.perf_counter() - t0
        mark("end")
    return {
        **r,
        "n": len(prompts),
        "wall": wall,
        "warm_wall": warm_wall,
        "warm_failed": w["failed"],
        "pool": f"1 session, limit {c}",
    }


# -- Driver + LocalExecutor / RayExecutor ---------------------------------------------------------


def accepted(fn: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` without the names ``fn`` does not take (others change these APIs)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def load_example(kind: str) -> Any:
    path = str(EXAMPLES[kind])
    try:
        from rollout_ray._cli.taskset_loader import import_taskset

        return import_taskset(path)
    except ImportError:
        import importlib.util

        name = "taskset_" + Path(path).stem
        s = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(s)
        sys.modules[name] = module
        s.loader.exec_module(module)
        return module


def make_config(module: Any, group: int, concurrency: int) -> Any:
    """The taskset's config with samples and max_in_flight set, as ``rollout-ray eval`` does."""
    try:
        from rollout_ray._cli.drive import eval_config

        return eval_config(module, samples=group, max_in_flight=concurrency)
    except (ImportError, TypeError):
        from rollout_ray import EvalConfig

        base = getattr(module, "config", None)
        if base is not None:
            return base.model_copy(update={"samples_per_task": group, "max_in_flight": concurrency})
        return EvalConfig(samples_per_task=group, max_in_flight=concurrency)


async def drive(
    module: Any, model: Any, executor: Any, config: Any, n: int, group: int, report: bool
) -> dict[str, Any]:
    from rollout_ray import Driver

    tasks = module.tasks(math.ceil(n / group))
    run_dir = tempfile.mkdtemp(prefix="bench_cost_run_")
    peak = [0]

    def on_progress(p: Any) -> None:
        in_flight = getattr(p, "in_flight", 0)
        peak[0] = max(peak[0], in_flight)
        if report:
            emit(f"@@PROG {getattr(p, 'done', 0)} {in_flight} {getattr(p, 'failed', 0)} {time.time():.3f}")

    try:
        driver = Driver(
            tasks,
            module.harness(),
            model,
            **accepted(
                Driver,
                {
                    "executor": executor,
                    "config": config,
                    "run_dir": os.path.join(run_dir, "run"),
                    "on_progress": on_progress,
                },
            ),
        )
        if report:
            mark("start")
        t0 = time.perf_counter()
        result = await driver.arun()
        wall = time.perf_counter() - t0
        if report:
            mark("end")
        result.samples  # read from the run directory when first asked for: before it is removed
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    progress = getattr(driver, "progress", None)
    out: dict[str, Any] = {
        "wall": wall,
        "n": len(tasks) * group,
        "failed": getattr(progress, "failed", -1),
        "done": getattr(progress, "done", -1),
        "driver_peak_in_flight": peak[0],
        "status": getattr(result, "status", "?"),
        "reason": getattr(result, "reason", ""),
    }
    try:  # why rollouts failed, most common first: a failed row must say why
        kinds: dict[str, int] = {}
        for kind, message in zip(
            result.samples.column("error_type").to_pylist(), result.samples.column("error_message").to_pylist()
        ):
            if kind is not None:
                key = f"{kind}: {(message or '')[:160]}"
                kinds[key] = kinds.get(key, 0) + 1
        out["errors"] = sorted(kinds.items(), key=lambda kv: -kv[1])[:2]
    except Exception:  # noqa: BLE001 - the error summary is optional in the results
        pass
    try:
        rewards = result.samples.column("reward").to_pylist()
        out["reward"] = sum(r or 0.0 for r in rewards) / max(1, len(rewards))
    except Exception:  # noqa: BLE001 - no reward column: the row says None
        out["reward"] = None
    return out


async def with_driver(spec: dict[str, Any]) -> dict[str, Any]:
    from rollout_ray import OpenAIModel

    kind, group, c = spec["kind"], spec["group"], spec["concurrency"]
    module = load_example(kind)
    config = make_config(module, group, c)
    extra: dict[str, Any] = {}
    stamp("imported")
    if spec["executor"] == "local":
        from rollout_ray import LocalExecutor

        executor = LocalExecutor()
        extra["pool"] = "in process"
    else:
        import ray

        from rollout_ray import RayExecutor

        try:
            from rollout_ray._ray.ray_executor import init_ray
        except ImportError:

            def init_ray(address: str | None) -> None:
                os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
                ray.init(address="local", include_dashboard=False, log_to_driver=False)

        t0 = time.perf_counter()
        init_ray(None)
        extra["ray_init_s"] = time.perf_counter() - t0
        # Only actors and capacity: the other arguments are others' to change.
        executor = RayExecutor(actors=spec["actors"], capacity=spec["capacity"])
        extra["pool"] = f"{spec['actors']} x {spec['capacity']}"
    model = OpenAIModel(spec["url"], name="simulated")
    stamp("executor_start")
    await executor.start()
    try:
        t0 = time.perf_counter()
        warm = await drive(module, model, executor, config, spec["warmup"], group, report=False)
        extra.update(warm_wall=time.perf_counter() - t0, warm_failed=warm["failed"], warm_errors=warm.get("errors"))
        ready = getattr(executor, "ready", None)
        if ready is not None:  # every actor answering a call, as eval's warm-up waits for
            try:
                await ready(programs=False)  # an in-process harness, as eval warms for it
            except TypeError:  # a tree from before ready(programs=)
                await ready()
        if spec["executor"] == "ray":
            try:
                pids = await asyncio.gather(*(a.actor.pid.remote() for a in executor._pool if a is not None))
                extra["rollout_actor_pids"] = list(pids)
            except Exception:  # noqa: BLE001 - the pids are an optional extra of the row
                pass
        r = await drive(module, model, executor, config, spec["n"], group, report=True)
    finally:
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(executor.stop(), 120)
        finally:
            try:
                await model.aclose()
            except Exception:  # noqa: BLE001 - closing must not hide the measurement
                pass
            if spec["executor"] == "ray":
                import ray

                ray.shutdown()
        extra["stop_s"] = time.perf_counter() - t0
    return {**r, **extra}


def main() -> None:
    spec = json.loads(sys.argv[1])
    raise_nofile()
    run = floor if spec["executor"] == "floor" else with_driver
    result = asyncio.run(run(spec))
    emit("@@RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
