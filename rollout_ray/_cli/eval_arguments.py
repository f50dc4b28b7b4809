"""The command line of ``rollout-ray eval``: its flags, their defaults and help.

Only the parser: what the flags mean for a run is ``eval.py`` (the run) and ``drive.py``
(the config and executor they make); their checks are ``checks.py`` and ``protections.py``.
"""

from __future__ import annotations

import argparse

from .._runtimes import providers
from .arguments import in_flight_bound, integer, json_object, k_list, number
from .drive import TOKEN_CAPTURES, version
from .protections import DEFAULT_AGENT_TIMEOUT, DEFAULT_MAX_TURNS

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"


def add_eval_flags(p: argparse.ArgumentParser) -> None:
    """The flags of ``rollout-ray eval`` (its run function is set by ``eval.add_eval_arguments``)."""
    p.add_argument("taskset", nargs="?", help="a .py file or a module defining tasks() and harness()")
    p.add_argument(
        "--verifiers",
        metavar="REF",
        help="instead of a taskset: a verifiers v1 taskset (a .py file, a "
        "module or an installed id exporting its Taskset in __all__), run unchanged; what is not mapped "
        "yet is refused before anything runs (needs the verifiers extra)",
    )
    p.add_argument("--version", action="version", version=f"rollout-ray {version()}")
    run = p.add_argument_group("run")
    run.add_argument(
        "--out", metavar="DIR", help="run directory for the manifest and Parquet shards (default: runs/<time>)"
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out (default: the latest run of "
        "this taskset under runs/), skipping what is stored (rollouts that failed for infrastructure "
        "or provider reasons are redone; with --retry-failed, every stored failure)",
    )
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run stored in --out (only a run directory: one with a manifest)",
    )
    run.add_argument(
        "--keep-failed", action="store_true", help="with --resume: keep every stored failure (none is redone)"
    )
    run.add_argument("--samples", metavar="N", type=integer(1), help="samples per task (n)")
    run.add_argument("--limit", metavar="N", type=integer(1), help="run only the first N tasks")
    run.add_argument(
        "--max-in-flight",
        metavar="N",
        type=in_flight_bound,
        help="rollouts running at once; 'auto': as many as keep the model's servers at their saturation "
        "point, read from their vLLM/SGLang /metrics",
    )
    run.add_argument(
        "--retries", metavar="N", type=integer(0), help="retries of a rollout lost to infrastructure (default 2)"
    )
    run.add_argument(
        "--retry-failed",
        action="store_true",
        help="also retry rollouts that failed inside (task or harness errors), up to --retries; "
        "with --resume, redo the stored ones too",
    )
    run.add_argument("--pass-k", type=k_list, metavar="K,K,...", help="pass@k values stored per group (e.g. 1,4,8)")
    model = p.add_argument_group("model")
    model.add_argument(
        "--model-url", metavar="URL", help="OpenAI-compatible base URL (default: the built-in simulated model)"
    )
    model.add_argument(
        "--model",
        metavar="NAME",
        default=None,
        help="model name sent upstream (default with --model-url: the server's only model, from its /v1/models)",
    )
    model.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="variable holding the provider's key (default: "
        f"{DEFAULT_API_KEY_ENV}, if set; a variable named here must be set)",
    )
    model.add_argument("--temperature", metavar="T", type=number(minimum=0), help="sampling temperature")
    model.add_argument("--top-p", metavar="P", type=number(above=0, maximum=1), help="nucleus sampling probability")
    model.add_argument("--max-tokens", metavar="N", type=integer(1), help="completion tokens per model call")
    model.add_argument("--seed", metavar="N", type=int, help="sampling seed sent with every request")
    model.add_argument(
        "--sampling",
        type=json_object,
        metavar="JSON",
        help="other sampling parameters as a JSON object, e.g. '{\"top_k\": 20}' (flags win)",
    )
    model.add_argument(
        "--sim-ttft", metavar="S", type=number(minimum=0), default=0.05, help="simulated model: seconds to first token"
    )
    model.add_argument(
        "--token-capture",
        choices=TOKEN_CAPTURES,
        default="auto",
        help="store the prompt and completion token ids and logprobs (input_ids, loss_mask, "
        "logprobs columns), asked in vLLM's or SGLang's request fields; auto (default): "
        "the server's own, found once per server by its info route (GET /version: vLLM, "
        "GET /get_model_info: SGLang; neither: nothing is asked or stored); off: never",
    )
    limits = p.add_argument_group("limits (per rollout)")
    limits.add_argument(
        "--max-turns",
        metavar="N",
        type=integer(0),
        help=f"model calls (default: {DEFAULT_MAX_TURNS}, unless the taskset's config sets it)",
    )
    limits.add_argument("--max-tokens-total", metavar="N", type=integer(0), help="input + output tokens over all turns")
    limits.add_argument("--max-input-tokens", metavar="N", type=integer(0), help="input tokens over all turns")
    limits.add_argument("--max-output-tokens", metavar="N", type=integer(0), help="output tokens over all turns")
    limits.add_argument("--timeout-setup", type=number(above=0), metavar="S", help="seconds for task and harness setup")
    limits.add_argument(
        "--timeout-agent",
        type=number(above=0),
        metavar="S",
        help=f"seconds for the agent, all segments (default: {DEFAULT_AGENT_TIMEOUT:g}, unless the "
        "taskset's config sets it)",
    )
    where = p.add_argument_group("where rollouts run")
    where.add_argument(
        "--executor",
        choices=["ray", "local"],
        default="ray",
        help="ray: rollout actors (default); local: this process, no Ray",
    )
    where.add_argument(
        "--address",
        metavar="ADDR",
        help="Ray cluster address (default: RAY_ADDRESS, else a private local Ray on 127.0.0.1)",
    )
    kinds = [providers.provider(n) for n in providers.names() if n != providers.AUTO]
    where.add_argument(
        "--runtime",
        choices=providers.names(),
        default=providers.AUTO,
        metavar="NAME",
        help="runtime of each rollout (its provider, docs/runtime-providers.md): "
        + ", ".join(f"{k.name} ({k.help})" for k in kinds)
        + f", {providers.AUTO} ({' else '.join(providers.AUTO_ORDER)}, said at the start and in the "
        "summary); sandbox never falls back, nor does any named runtime: refused where it cannot run",
    )
    where.add_argument(
        "--actors",
        metavar="N",
        type=integer(1),
        default=None,
        help="rollout actors (ray executor; default: one per CPU of the cluster, at most 32; "
        "for the private local Ray, of this machine)",
    )
    where.add_argument(
        "--capacity",
        metavar="K",
        type=integer(1),
        default=None,
        help="rollouts per actor at once (ray executor; default: no cap, --max-in-flight bounds the run)",
    )
