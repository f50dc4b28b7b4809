"""What a run amounts to: the summary printed by ``eval`` and ``report``, and the plot."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

SPANS = ("boot_s", "setup_s", "agent_s", "agent_model_s", "agent_harness_s", "finalize_s", "scoring_s")


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(samples: pa.Table, groups: pa.Table) -> dict[str, Any]:
    """The run's numbers: counts, reward, pass@k, stops, errors, span quantiles, tokens."""
    n = samples.num_rows
    ok = int(pc.sum(samples["ok"]).as_py() or 0) if n else 0
    rewards = samples["reward"].to_pylist() if n else []
    out: dict[str, Any] = {
        "rollouts": n,
        "ok": ok,
        "failed": n - ok,
        "groups": groups.num_rows,
        "mean_reward": sum(rewards) / n if n else math.nan,
        "pass_at": {},
        "stop_conditions": dict(Counter(samples["stop_condition"].to_pylist()).most_common()) if n else {},
        "error_types": dict(Counter(e for e in samples["error_type"].to_pylist() if e).most_common()) if n else {},
        "spans": {},
        "tokens": {},
    }
    for name in groups.column_names if groups.num_rows else ():
        if name.startswith("pass_at_"):
            values = [v for v in groups[name].to_pylist() if v is not None]
            if values:
                out["pass_at"][int(name.removeprefix("pass_at_"))] = sum(values) / len(values)
    for span in SPANS:
        if span in samples.column_names:
            values = samples[span].to_pylist()
            out["spans"][span.removesuffix("_s")] = (_quantile(values, 0.5), _quantile(values, 0.95))
    for column in ("num_input_tokens", "num_output_tokens", "num_total_tokens", "num_turns"):
        if column in samples.column_names and n:
            total = int(pc.sum(samples[column]).as_py() or 0)
            out["tokens"][column.removeprefix("num_")] = (total, total / n)
    return out


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as text, one fact per line."""
    lines = [
        f"rollouts {summary['rollouts']}  ok {summary['ok']}  failed {summary['failed']}  "
        f"groups {summary['groups']}",
        f"mean reward {summary['mean_reward']:.4f}",
    ]
    if summary["pass_at"]:
        lines.append("pass@k  " + "  ".join(f"pass@{k} {v:.4f}" for k, v in sorted(summary["pass_at"].items())))
    lines.append("stop conditions  " + _counts(summary["stop_conditions"]))
    lines.append("error types  " + (_counts(summary["error_types"]) or "none"))
    lines.append("time per span (p50 / p95, ms)")
    for span, (p50, p95) in summary["spans"].items():
        lines.append(f"  {span:<14} {p50 * 1000:9.1f} {p95 * 1000:9.1f}")
    lines.append("tokens (total / per rollout)")
    for name, (total, mean) in summary["tokens"].items():
        lines.append(f"  {name:<14} {total:>12,} {mean:12.1f}")
    return "\n".join(lines)


def _counts(counts: dict[Any, int]) -> str:
    return "  ".join(f"{k}={v}" for k, v in counts.items())


def plot(samples: pa.Table, path: str) -> str:
    """Write a PNG: the reward distribution and the time per span. Returns ``path``."""
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
