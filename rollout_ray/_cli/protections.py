"""Defaults that protect a CLI run: finite budgets per rollout, and no silent loss of isolation.

An agent loop that never stops would run forever under ``EvalConfig()``'s defaults (no turn,
token or time limit): the CLI fills what neither its flags nor the taskset's config set with
``DEFAULT_MAX_TURNS`` and ``DEFAULT_AGENT_TIMEOUT``, and its summary says which budgets held.
Its summary also says where rollouts ran when ``--runtime auto`` fell back to ``LocalRuntime``
(which isolates nothing: a program reads what the host's user reads), as the start does; and
``--runtime NAME`` refuses to start where that provider cannot run, never falling back.
"""

from __future__ import annotations

from collections import Counter

from .._driver.eval_config import EvalConfig
from .._errors import UsageError
from .._runtimes.host import runtime_kind
from .._runtimes.providers import AUTO, AUTO_ORDER, provider

DEFAULT_MAX_TURNS = 100
"""Model calls per rollout when neither ``--max-turns`` nor the taskset's config sets them."""

DEFAULT_AGENT_TIMEOUT = 1800.0
"""Seconds for a rollout's agent when neither ``--timeout-agent`` nor the taskset's config
sets them."""


def with_finite_defaults(config: EvalConfig) -> tuple[EvalConfig, list[str]]:
    """``config`` with the CLI's turn and agent-time defaults where it sets none, and the
    names of the budgets that came from these defaults."""
    defaulted = []
    limits, timeouts = config.limits, config.timeouts
    update: dict[str, object] = {}
    if limits.max_turns is None:
        update["limits"] = type(limits)(**{**vars(limits), "max_turns": DEFAULT_MAX_TURNS})
        defaulted.append("max_turns")
    if timeouts.agent is None:
        update["timeouts"] = type(timeouts)(**{**vars(timeouts), "agent": DEFAULT_AGENT_TIMEOUT})
        defaulted.append("agent")
    return (config.model_copy(update=update) if update else config), defaulted


def budgets_line(config: EvalConfig, defaulted: list[str]) -> str:
    """The summary's line of a rollout's budgets, saying which are the CLI's defaults."""

    def mark(name: str) -> str:
        return " (default)" if name in defaulted else ""

    limits, timeouts = config.limits, config.timeouts
    parts = [f"max_turns {limits.max_turns}{mark('max_turns')}" if limits.max_turns is not None else "max_turns none"]
    tokens = [
        f"{name} {value}"
        for name, value in (
            ("max_input_tokens", limits.max_input_tokens),
            ("max_output_tokens", limits.max_output_tokens),
            ("max_total_tokens", limits.max_total_tokens),
        )
        if value is not None
    ]
    parts += tokens or ["tokens no cap"]
    parts.append(f"agent {timeouts.agent:g}s{mark('agent')}" if timeouts.agent is not None else "agent no time limit")
    return "budgets per rollout  " + "  ".join(parts)


def runtime_line(requested: str, tasks: object = (), config: EvalConfig | None = None) -> str:
    """The summary's line of where rollouts ran, saying so when nothing isolated them: the
    run's kind (``EvalConfig.runtime``, else ``--runtime``) and the kinds tasks asked for
    themselves (``TaskData.runtime``), each with its count of tasks. Before, the line named
    ``--runtime`` whatever the config or the tasks asked for."""
    flag = "EvalConfig.runtime" if config is not None and config.runtime else "--runtime"
    default = config.runtime if config is not None and config.runtime else requested
    kind, reason = runtime_kind(default)
    chosen = provider(kind)
    if reason is not None:
        line = (
            f"runtime  {chosen.label}: {flag} {AUTO} fell back, no {AUTO_ORDER[0]} on this machine ({reason}); "
            "rollouts were isolated neither from each other nor from the host"
        )
    elif not chosen.capabilities.isolation:
        line = f"runtime  {chosen.label} ({flag} {kind}): rollouts isolated neither from each other nor from the host"
    else:
        line = f"runtime  {chosen.label}"
    own = Counter(
        task.data.runtime
        for task in (tasks if isinstance(tasks, (list, tuple)) else ())
        if task.data.runtime is not None and task.data.runtime != default
    )
    if own:
        line += "; tasks' own: " + ", ".join(_kind_count(asked, n) for asked, n in own.items())
    return line


def _kind_count(asked: str, n: int) -> str:
    found = provider(runtime_kind(asked)[0])
    isolated = "" if found.capabilities.isolation else ", not isolated"
    return f"{found.label} ({n} task{'s' if n != 1 else ''}{isolated})"


def check_runtime(requested: str, *, remote: bool) -> None:
    """``--runtime NAME`` on a machine that cannot run that provider is refused before
    anything starts (on a remote cluster, ``remote``, its nodes are not this machine's to
    judge); ``auto`` falls back instead, saying so.

    Raises:
        UsageError: naming the reason, and ``--runtime local`` as the way to run unisolated.
    """
    if requested == AUTO or remote:
        return
    reason = provider(requested).unavailable()
    if reason is not None:
        raise UsageError(
            f"--runtime {requested}: this machine cannot run the {requested} ({reason}); install what "
            "it needs, or pass --runtime local to run rollouts without isolation"
        )


def nodes_line(requested: str, lacking: dict[str, str], nodes: int) -> str | None:
    """One line saying which nodes of a remote cluster cannot run the requested kind (``None``:
    every node can), and what their rollouts get."""
    if not lacking:
        return None
    address, reason = next(iter(lacking.items()))
    kind = AUTO_ORDER[0] if requested == AUTO else requested
    then = (
        f"rollouts there run in the {AUTO_ORDER[-1]} runtime, isolated neither from each other nor from the host"
        if requested == AUTO
        else "rollouts there fail; pass --runtime local to run them without isolation"
    )
    return (
        f"rollout-ray: {len(lacking)} of {nodes} nodes cannot run the {kind} runtime ({address}: {reason}): "
        f"{then} (pod security: docs/runtime-providers.md)"
    )


def kinds_asked(requested: str, tasks: object, config: EvalConfig) -> dict[str, str]:
    """``{kind: who asks for it}`` of a run: the run's (``EvalConfig.runtime``, else
    ``--runtime``) and every task's own (``TaskData.runtime``) — of a taskset that is a list;
    an iterator's tasks are not read ahead (a kind of theirs is refused when its rollout runs)."""
    default = config.runtime or requested
    asked = {default: "EvalConfig.runtime" if config.runtime else "--runtime"}
    for task in tasks if isinstance(tasks, (list, tuple)) else ():
        kind = task.data.runtime
        if kind is not None and kind not in asked:
            asked[kind] = f"task {task.data.idx} asks for runtime {kind!r}"
    return asked


def check_runtimes(requested: str, tasks: object, config: EvalConfig, *, remote: bool) -> None:
    """Every kind a run asks for (``kinds_asked``) is a provider's, and — on this machine, not
    a remote cluster's (``remote``: its nodes are asked, ``node_check``) — one it runs: else
    refused before anything starts, naming who asked and why.

    Raises:
        UsageError: an unknown kind (naming the known ones) or one this machine cannot run.
    """
    for kind, who in kinds_asked(requested, tasks, config).items():
        if who == "--runtime":
            check_runtime(kind, remote=remote)
            continue
        try:
            found = provider(kind) if kind != AUTO else None
        except ValueError as e:
            raise UsageError(f"{who}: {e}") from None
        reason = None if found is None or remote else found.unavailable()
        if reason is not None:
            raise UsageError(
                f"{who}: this machine cannot run it ({reason}); install what it needs, or name another kind"
            )
