"""The sweep's comparison: one row per point, as Parquet / CSV, a terminal table and a plot."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pyarrow as pa

from .grid import Point
from .summary import SPANS, counted_rewards, summarize


def comparison_row(
    point: Point, samples: pa.Table, groups: pa.Table, status: str, reason: str, run_dir: str
) -> dict[str, Any]:
    """One point's settings and ``summarize`` numbers as flat columns.

    ``status`` is the driver's (``completed`` or ``halted``), or ``stored`` for a point that
    ``--resume`` skipped because every rollout of it is stored.
    """
    s = summarize(samples, groups)
    rewards = counted_rewards(samples)  # as the mean counts them: a failure is 0
    sem = math.nan
    if len(rewards) > 1:
        var = sum((r - s["mean_reward"]) ** 2 for r in rewards) / (len(rewards) - 1)
        sem = math.sqrt(var / len(rewards))
    row: dict[str, Any] = {"point": point.name, **point.settings(), "status": status}
    row.update({k: s[k] for k in ("rollouts", "ok", "failed", "groups", "mean_reward")})
    row["reward_sem"] = sem
    row.update({f"pass_at_{k}": v for k, v in sorted(s["pass_at"].items())})
    for name, (total, mean) in s["tokens"].items():
        row.update({name: total, f"{name}_per_rollout": mean})
    for span, (p50, p95) in s["spans"].items():
        row.update({f"{span}_p50_s": p50, f"{span}_p95_s": p95})
    row.update({f"stop_{k}": v for k, v in s["stop_conditions"].items()})
    row.update({f"error_{k}": v for k, v in s["error_types"].items()})
    return {**row, "reason": reason or None, "run_dir": run_dir}


def comparison_table(rows: list[dict[str, Any]]) -> pa.Table:
    """One row per point; counts a point lacks are 0, settings it lacks are null."""
    settings = dict.fromkeys(k for row in rows for k in itertools.takewhile(lambda k: k != "status", row))
    rest = [k for k in dict.fromkeys(k for row in rows for k in row) if k not in settings]
    tail = ("stop_", "error_", "reason", "run_dir")
    rest.sort(key=lambda n: next((i + 1 for i, t in enumerate(tail) if n.startswith(t)), 0))
    columns = {}
    for name in [*settings, *rest]:
        count = name.startswith(("stop_", "error_"))
        values = [row.get(name, 0 if count else None) for row in rows]
        kinds = {type(v) for v in values if v is not None}
        if len(kinds) > 1 and not kinds <= {int, float}:  # a setting given as both 1 and "1"
            values = [None if v is None else str(v) for v in values]
        columns[name] = values
    return pa.table(columns)


def format_comparison(table: pa.Table) -> str:
    """The table's main columns as aligned text (every column is in the Parquet and CSV)."""
    settings = table.column_names[1 : table.column_names.index("status")]
    passes = [c for c in table.column_names if c.startswith("pass_at_")]
    header = [
        "#",
        *settings,
        "status",
        "rollouts",
        "failed",
        "mean reward ± sem",
        *(c.replace("pass_at_", "pass@") for c in passes),
        "tokens/rollout",
        "agent p50/p95 ms",
        "stop conditions",
        "error types",
    ]
    lines = [header]
    for row in table.to_pylist():
        counts = {
            p: " ".join(f"{k.removeprefix(p)}={v}" for k, v in row.items() if k.startswith(p) and v)
            for p in ("stop_", "error_")
        }
        lines.append(
            [
                row["point"].split("-", 1)[0],
                *("-" if row[c] is None else str(row[c]) for c in settings),
                row["status"],
                str(row["rollouts"]),
                str(row["failed"]),
                f"{row['mean_reward']:.4f} ± {row['reward_sem']:.4f}",
                *(_number(row[c], ".4f") for c in passes),
                _number(row.get("total_tokens_per_rollout"), ".1f"),
                f"{_ms(row.get('agent_p50_s'))} / {_ms(row.get('agent_p95_s'))}",
                counts["stop_"],
                counts["error_"] or "none",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, spec)


def _ms(seconds: float | None) -> str:
    return _number(None if seconds is None else seconds * 1000, ".1f")


def plot_comparison(table: pa.Table, path: Any) -> Any:
    """Write a PNG to ``path`` (a file name, or a binary file): mean reward ± sem per point, and
    p50 (bar) to p95 (whisker) per span."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    rows = table.to_pylist()
    labels = [r["point"].split("-", 1)[0] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5 + 0.25 * len(rows)), layout="constrained")
    means = [_finite(r["mean_reward"]) for r in rows]
    left.errorbar(range(len(rows)), means, yerr=[_finite(r["reward_sem"]) for r in rows], fmt="o", capsize=4)
    left.set_xticks(range(len(rows)), labels)
    left.set(title="mean reward (± s.e.m.) per point", xlabel="point", ylabel="reward")
    spans = [s.removesuffix("_s") for s in SPANS if f"{s.removesuffix('_s')}_p50_s" in table.column_names]
    width = 0.8 / max(1, len(rows))
    for j, r in enumerate(rows):
        p50 = [_finite(r[f"{s}_p50_s"]) * 1000 for s in spans]
        p95 = [_finite(r[f"{s}_p95_s"]) * 1000 for s in spans]
        whisker = [[0.0] * len(spans), [max(0.0, b - a) for a, b in zip(p50, p95, strict=True)]]
        right.bar([i + j * width for i in range(len(spans))], p50, width, yerr=whisker, capsize=2, label=r["point"])
    right.set_xticks([i + 0.4 - width / 2 for i in range(len(spans))], spans, rotation=30)
    right.set(title="time per span (p50, whisker to p95)", ylabel="ms")
    fig.legend(loc="outside lower center", fontsize="small", ncols=1)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _finite(value: float | None) -> float:
    return 0.0 if value is None or math.isnan(value) else value
