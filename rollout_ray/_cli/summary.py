"""What a run amounts to: the summary printed by ``eval`` and ``report``, and the plot."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .._driver.finalize import counted_reward, judge_columns, pass_at_k
from .._errors import SchemaMismatch
from .._record.store import read_run

SPANS = ("boot_s", "setup_s", "agent_s", "agent_model_s", "agent_harness_s", "finalize_s", "scoring_s")


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


FAILED_RULE = "failed rollouts count as reward 0 and not passing"
"""How every figure of the summary (and the group statistics, ``finalize``) counts a failure."""

MESSAGE_CHARS = 160
"""Characters of an error's first message the summary shows (its first line, cut here)."""


def summarize(
    samples: pa.Table,
    groups: pa.Table,
    *,
    timing: dict[str, float | None] | None = None,
    status: str = "completed",
    reason: str = "",
) -> dict[str, Any]:
    """The run's numbers: counts, reward, pass@k, the task's metrics, the judge's columns, stops,
    errors (each type's count and first message), the judge's failures, span quantiles, tokens,
    time.

    A failed rollout counts as reward 0 and not passing (``FAILED_RULE``), as in ``finalize``.
    ``pass_at`` holds every k the groups' sample count allows (1, 2, 4, ... and n) and any
    stored one. ``timing``: eval's clock (``wall``, ``start``, ``rollouts`` seconds and
    ``rate`` over ``rollouts``); without it (``report``), the rollouts' span and rate are read
    from their stored spans. ``status`` / ``reason``: the driver's, a halt printed first.
    """
    n = samples.num_rows
    ok = int(pc.sum(samples["ok"]).as_py() or 0) if n else 0
    rewards = counted_rewards(samples)
    errors = samples["error_type"].to_pylist() if n else []
    out: dict[str, Any] = {
        "status": status,
        "reason": reason,
        "rollouts": n,
        "ok": ok,
        "failed": n - ok,
        "groups": groups.num_rows,
        "rejected": _rejected(groups),
        "mean_reward": sum(rewards) / len(rewards) if rewards else math.nan,
        "pass_at": _pass_at(groups),
        "metrics": _metrics(samples),
        "judge": _judged(samples),
        "stop_conditions": dict(Counter(samples["stop_condition"].to_pylist()).most_common()) if n else {},
        "error_types": dict(Counter(e for e in errors if e).most_common()),
        "first_errors": _first_messages(
            errors, samples["error_message"].to_pylist() if "error_message" in samples.column_names else [None] * n
        ),
        "judge_failures": _judge_failures(groups),
        "spans": {},
        "tokens": {},
        "time": dict(timing) if timing is not None else _span_of_run(samples),
    }
    for span in SPANS:
        if span in samples.column_names:
            values = samples[span].to_pylist()
            out["spans"][span.removesuffix("_s")] = (_quantile(values, 0.5), _quantile(values, 0.95))
    for column in ("num_input_tokens", "num_output_tokens", "num_total_tokens", "num_turns"):
        if column in samples.column_names and n:
            total = int(pc.sum(samples[column]).as_py() or 0)
            out["tokens"][column.removeprefix("num_")] = (total, total / n)
    return out


def counted_rewards(samples: pa.Table) -> list[float]:
    """Each rollout's reward as every figure counts it: 0.0 where the rollout failed."""
    return counted_reward(samples).to_pylist() if samples.num_rows else []


def _first_messages(types: list[str | None], messages: list[str | None]) -> dict[str, str]:
    """The first message of each error type, as one line of at most ``MESSAGE_CHARS``."""
    first: dict[str, str] = {}
    for kind, message in zip(types, messages):
        if kind and kind not in first:
            first[kind] = first_line(message or "")
    return first


def first_line(message: str, limit: int = MESSAGE_CHARS) -> str:
    """``message``'s first non-empty line, cut to ``limit`` characters; an ellipsis marks a cut
    or lines left out."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    if len(lines[0]) > limit:
        return lines[0][: limit - 1].rstrip() + "…"
    return lines[0] + (" …" if len(lines) > 1 else "")


def _rejected(groups: pa.Table) -> dict[str, int]:
    """Groups kept from the stream, by the rule that refused them (``keep_rule``): stored and
    counted in every figure here, not handed to a trainer."""
    if not groups.num_rows or "rejected" not in groups.column_names:
        return {}
    return dict(Counter(r.split(":", 1)[0].split(" ", 1)[0] for r in groups["rejected"].to_pylist() if r).most_common())


def _judge_failures(groups: pa.Table) -> tuple[int, str | None]:
    """How many groups the judge failed on, and its first message."""
    if not groups.num_rows or "judge_error" not in groups.column_names:
        return 0, None
    failures = [e for e in groups["judge_error"].to_pylist() if e]
    return len(failures), (first_line(failures[0]) if failures else None)


def _pass_at(groups: pa.Table) -> dict[int, float]:
    """Mean unbiased pass@k over the groups, for every k their sample count allows."""
    names = groups.column_names if groups.num_rows else []
    stored = {int(c.removeprefix("pass_at_")) for c in names if c.startswith("pass_at_")}
    if not {"n_valid", "n_correct"} <= set(names):
        ks, values = sorted(stored), {k: groups[f"pass_at_{k}"].to_pylist() for k in stored}
    else:
        n = groups["n_valid"].to_numpy(zero_copy_only=False)
        c = groups["n_correct"].to_numpy(zero_copy_only=False)
        most = int(n.max(initial=0))
        ks = sorted(
            {k for k in stored if k <= most}
            | {2**i for i in range(most.bit_length()) if 2**i <= most}
            | ({most} if most else set())
        )
        values = {k: pass_at_k(n, c, k).to_pylist() for k in ks}
    out = {}
    for k in ks:
        counted = [v for v in values[k] if v is not None]
        if counted:
            out[k] = sum(counted) / len(counted)
    return out


def _metrics(samples: pa.Table) -> dict[str, tuple[float, float, float]]:
    """Each ``@metric``'s mean, p50 and p95 over the rollouts that have it."""
    if not samples.num_rows or "metrics" not in samples.column_names:
        return {}
    found: dict[str, list[float]] = {}
    for row in samples["metrics"].to_pylist():
        for name, value in row or ():
            if value is not None and not math.isnan(value):
                found.setdefault(name, []).append(value)
    return {name: (sum(v) / len(v), _quantile(v, 0.5), _quantile(v, 0.95)) for name, v in sorted(found.items())}


def _judged(samples: pa.Table) -> dict[str, tuple[float, float, float]]:
    """Each column the group judge added (``reward_*`` / ``metric_*``): its mean, p50 and p95
    over the rollouts it gave a value (not None, not NaN)."""
    out = {}
    for name in sorted(judge_columns(samples.column_names) if samples.num_rows else []):
        values = [v for v in samples[name].to_pylist() if isinstance(v, (int, float)) and not math.isnan(v)]
        if values:
            out[name] = (sum(values) / len(values), _quantile(values, 0.5), _quantile(values, 0.95))
    return out


def _span_of_run(samples: pa.Table) -> dict[str, float | None]:
    """What the stored spans tell of the run's time: from the first rollout's start to the
    last one's end (``span``; a resumed run's includes the pause), and the rollouts over it."""
    if not samples.num_rows or "started_at" not in samples.column_names:
        return {}
    starts = samples["started_at"].to_numpy(zero_copy_only=False)
    total = sum(
        samples[s].fill_null(0.0).to_numpy(zero_copy_only=False)
        for s in SPANS
        if s in samples.column_names and s not in ("agent_model_s", "agent_harness_s")
    )
    value = float((starts + total).max() - starts.min())
    if not math.isfinite(value):
        return {}
    return {"span": value, "rate": samples.num_rows / value if value > 0 else None}


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as text, one fact per line; a halt's reason first."""
    lines = []
    if summary.get("status") == "halted":
        lines.append(f"halted: {summary['reason']}")
    lines += [
        f"rollouts {summary['rollouts']}  ok {summary['ok']}  failed {summary['failed']}  groups {summary['groups']}",
        f"mean reward {summary['mean_reward']:.4f}  ({FAILED_RULE}, here and in pass@k)",
    ]
    if summary.get("rejected"):
        lines.append(f"groups not streamed  {_counts(summary['rejected'])}  (stored, and counted above)")
    if summary["pass_at"]:
        lines.append("pass@k  " + "  ".join(f"pass@{k} {v:.4f}" for k, v in sorted(summary["pass_at"].items())))
    if summary.get("metrics"):
        lines.append("metrics (mean / p50 / p95)")
        for name, (mean, p50, p95) in summary["metrics"].items():
            lines.append(f"  {name:<22} {mean:10.4f} {p50:10.4f} {p95:10.4f}")
    if summary.get("judge"):
        lines.append("judge columns (mean / p50 / p95, over the rollouts it gave a value)")
        for name, (mean, p50, p95) in summary["judge"].items():
            lines.append(f"  {name:<22} {mean:10.4f} {p50:10.4f} {p95:10.4f}")
    lines.append("stop conditions  " + _counts(summary["stop_conditions"]))
    lines.append("error types  " + (_counts(summary["error_types"]) or "none"))
    width = max((len(k) for k in summary.get("first_errors", {})), default=0)
    for kind, message in summary.get("first_errors", {}).items():
        lines.append(f"  {kind:<{width}}  first: {message}")
    judged, first = summary.get("judge_failures", (0, None))
    if judged:
        lines.append(f"judge failed on {judged} of {summary['groups']} groups  first: {first}")
    lines.append("time per span (p50 / p95, ms)")
    for span, (p50, p95) in summary["spans"].items():
        lines.append(f"  {span:<14} {p50 * 1000:9.1f} {p95 * 1000:9.1f}")
    lines.append("tokens (total / per rollout)")
    for name, (total, mean) in summary["tokens"].items():
        lines.append(f"  {name:<14} {total:>12,} {mean:12.1f}")
    if "token_rows" in summary:
        lines.append(token_data(summary))
    lines += summary.get("protections", [])  # the budgets that held, and where rollouts ran
    time_line = _time_line(summary.get("time") or {})
    if time_line:
        lines.append(time_line)
    return "\n".join(lines)


def _time_line(time: dict[str, float | None]) -> str:
    """Eval's clock (``wall``: the command; ``start``: before the first rollout could run;
    ``rollouts``: the driver's run) or, from stored spans, the rollouts' ``span``."""
    rate = time.get("rate")
    if time.get("wall") is not None:
        line = f"wall {time['wall']:.1f}s (start {time.get('start') or 0.0:.1f}s, rollouts {time['rollouts']:.1f}s)"
        return line + (f"  {rate:.1f} rollouts/s over the rollouts' {time['rollouts']:.1f}s" if rate else "")
    if time.get("span") is not None:
        line = f"rollouts' span {time['span']:.1f}s (first start to last end, from the stored spans)"
        return line + (f"  {rate:.1f} rollouts/s over it" if rate else "")
    return ""


def stored_token_rows(run_dir: str) -> int:
    """The run's rollouts that stored token ids: a non-null ``token_drift``, the one small
    token column (the ids are not read). A run with a shard older than the token columns
    counts none."""
    try:
        table = read_run(run_dir, columns=["token_drift"])
    except SchemaMismatch:
        return 0
    return table.num_rows - table.column("token_drift").null_count  # type: ignore[no-any-return]


def token_data(summary: dict[str, Any]) -> str:
    """One line: how many rollouts stored token data, and how it was captured, or why not.

    Reads ``token_rows`` (``stored_token_rows``) and, from eval, ``token_capture``:
    ``{"capture": --token-capture, "dialect": what the server speaks (None: no token ids;
    "unknown": it could not be asked)}``.
    """
    stored, total, how = summary["token_rows"], summary["rollouts"], summary.get("token_capture")
    if how is None:  # report: the run directory does not say how
        return f"token data: stored for {stored} of {total} rollouts" if stored else "token data: none"
    if stored:
        named = how["dialect"] if how["dialect"] not in (None, "unknown") else how["capture"]
        return f"token data: stored for {stored} of {total} rollouts ({named})"
    if how["capture"] == "off":
        return "token data: none (--token-capture off)"
    if how["dialect"] is None:
        return (
            "token data: none (the server offers no token ids: it answers neither vLLM's GET /version "
            "nor SGLang's GET /get_model_info)"
        )
    if how["dialect"] == "unknown":
        return "token data: none (--token-capture auto could not ask the server which it is)"
    return f"token data: none (asked in {how['dialect']}'s request fields; no rollout recorded token ids)"


def _counts(counts: dict[Any, int]) -> str:
    return "  ".join(f"{k}={v}" for k, v in counts.items())


def plot(samples: pa.Table, path: Any) -> Any:
    """Write a PNG to ``path`` (a file name, or a binary file): the reward distribution and the
    time per span. Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.hist(samples["reward"].to_pylist(), bins=20, color="#4477aa")
    left.set(title="reward distribution", xlabel="reward", ylabel="rollouts")
    spans = [s for s in SPANS if s in samples.column_names]
    right.boxplot([[v * 1000 for v in samples[s].to_pylist()] for s in spans], showfliers=False)
    right.set_xticks(range(1, len(spans) + 1), [s.removesuffix("_s") for s in spans], rotation=30)
    right.set(title="time per span", ylabel="ms")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
