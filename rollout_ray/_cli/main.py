"""The ``rollout-ray`` command.

    rollout-ray eval TASKSET [--out DIR] [--resume] [--model-url URL] [--samples N] ...
    rollout-ray report RUN_DIR [--plot PNG]
    rollout-ray rescore RUN_DIR [--taskset FILE] [--workers N]
    rollout-ray sweep GRID.toml [--out DIR] [--resume] [--executor ray|local]
    rollout-ray view [RUN_DIR ...] [--port P]
    rollout-ray ctl RUN_DIR status|cancel ROLLOUT|requeue ROLLOUT|set max-in-flight N|pause|resume|stop
    rollout-ray serve-model [--host H] [--port P] [--ttft S] ...
    rollout-ray --version

A bad command line is one line, ``rollout-ray <command>: error: <what>``, exit 2 (``arguments``).

A TASKSET is a ``.py`` file or an importable module defining ``tasks()`` (an iterable of
``Task``) and ``harness()`` (a ``Harness``); optionally ``config`` (an ``EvalConfig`` with the
taskset's defaults) and ``judge`` (the cross-trace finalize hook). A GRID file is described
in ``rollout_ray._cli.sweep`` and ``examples/sweep.toml``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from .._errors import UsageError
from .arguments import OneLineParser
from .drive import version


def _serve_model(args: argparse.Namespace) -> int:
    import asyncio

    from .._simulated.config import SimulatedModelConfig
    from .._simulated.model_server import SimulatedModelServer
    from .interrupt import Stop, serve_until_signal

    try:
        config = SimulatedModelConfig(
            ttft=args.ttft,
            per_token=args.per_token,
            error_rate=args.error_rate,
            rate_429=args.rate_429,
            rate_5xx=args.rate_5xx,
            rate_timeout=args.rate_timeout,
            rate_malformed=args.rate_malformed,
            seed=args.seed,
            model_name=args.model_name,
            max_completion_tokens=args.max_completion_tokens,
            temperature_error=args.temperature_error,
            dialect=args.dialect,
            return_tokens_as_token_ids=args.return_tokens_as_token_ids,
            template_drift=args.template_drift,
            policy_version=args.policy_version,
        )
    except ValidationError as e:
        print(f"rollout-ray serve-model: invalid settings:\n{e}", file=sys.stderr)
        return 2

    async def start() -> tuple[str, Stop]:
        server = SimulatedModelServer(config)
        return await server.start(args.host, args.port), server.stop

    asyncio.run(serve_until_signal(start, lambda url: print(f"simulated model serving at {url}", flush=True)))
    return 0


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="rollout-ray", description="RL rollouts on Ray.")
    p.add_argument("--version", action="version", version=f"rollout-ray {version()}")
    sub = p.add_subparsers(dest="command", required=True)
    from .eval import add_eval_arguments
    from .report import add_report_arguments

    add_eval_arguments(_command(sub, "eval", help="run a taskset and summarise it"))
    add_report_arguments(_command(sub, "report", help="summarise a run directory and plot it"))
    from .sweep import add_sweep_arguments

    add_sweep_arguments(_command(sub, "sweep", help="eval every point of a grid and compare them"))
    from .rescore_cmd import add_rescore_arguments

    add_rescore_arguments(_command(sub, "rescore", help="score a stored run again, without a model or a sandbox"))
    from .view import add_view_arguments

    add_view_arguments(_command(sub, "view", help="browse run directories in a local web page"))
    from .ctl import add_ctl_arguments

    add_ctl_arguments(_command(sub, "ctl", help="see and steer a live run"))
    serve = _command(sub, "serve-model", help="serve the built-in simulated OpenAI-compatible model")
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback)")
    serve.add_argument("--port", type=int, default=8000, help="port (0 picks a free one)")
    serve.add_argument("--ttft", type=float, default=0.05, help="seconds to the first token")
    serve.add_argument("--per-token", type=float, default=0.0, help="seconds per completion token")
    serve.add_argument("--error-rate", type=float, default=0.0, help="share of wrong arithmetic answers")
    serve.add_argument("--rate-429", type=float, default=0.0, help="share of 429 answers")
    serve.add_argument("--rate-5xx", type=float, default=0.0, help="share of 5xx answers")
    serve.add_argument(
        "--rate-timeout", type=float, default=0.0, help="share of requests held until the client times out"
    )
    serve.add_argument("--rate-malformed", type=float, default=0.0, help="share of malformed bodies")
    serve.add_argument("--seed", type=int, default=0, help="seed of every random draw")
    serve.add_argument("--model-name", default="simulated", help="model name in answers")
    serve.add_argument("--max-completion-tokens", type=int, default=256, help="cap on completion tokens")
    serve.add_argument(
        "--temperature-error",
        type=float,
        default=0.5,
        help="how fast wrong answers grow with temperature (see SimulatedModelConfig)",
    )
    serve.add_argument(
        "--dialect",
        choices=["vllm", "sglang"],
        default="vllm",
        help="token-capture shapes and info route when a request does not say",
    )
    serve.add_argument(
        "--return-tokens-as-token-ids",
        action="store_true",
        help="logprob tokens read token_id:N, as vLLM's flag of that name",
    )
    serve.add_argument(
        "--template-drift",
        action="store_true",
        help="re-tokenize earlier assistant turns differently from how they were sampled",
    )
    serve.add_argument("--policy-version", type=int, default=0, help="initial X-Policy-Version")
    serve.set_defaults(run=_serve_model)
    return p


def _command(sub: argparse._SubParsersAction[OneLineParser], name: str, **kwargs: Any) -> argparse.ArgumentParser:
    command = sub.add_parser(name, **kwargs)
    command.set_defaults(command_parser=command)
    return command


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    args.argv = argv
    try:
        code = int(args.run(args))
        sys.stdout.flush()  # here, so a closed pipe is caught below rather than at exit
        return code
    except UsageError as e:
        command_parser: argparse.ArgumentParser = args.command_parser
        command_parser.error(str(e))  # exits
    except KeyboardInterrupt:  # a command without its own handling (eval has it): one line, no traceback
        print(f"\nrollout-ray {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader left (`rollout-ray report RUN | head`): stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
