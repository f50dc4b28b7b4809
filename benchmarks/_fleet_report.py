"""bench_fleet.py's results: one mode's outcome, the table and the plot of a comparison."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from _svg_plot import Panel, svg  # benchmarks/ is the script's directory


@dataclass
class Outcome:
    mode: str
    steps: int = 0
    wall: float = 0.0
    idle: float = 0.0
    tokens: int = 0
    leaked: int = 0
    """Task errors nobody retrieved (the teardown's cancelled reads)."""
    staleness: Counter[int] = field(default_factory=Counter)
    series: list[tuple[float, float, int, int, str]] = field(default_factory=list)
    """(seconds, utilisation, rollouts in flight, requests waiting, the trainer's phase) every
    ``--sample`` s; the phase is ``wait`` (for groups), ``train`` or ``update`` (the pause for
    the weight update: ``driver.paused`` and ``reload_weights``)."""
    step_ends: list[float] = field(default_factory=list)
    """Seconds since the start at which each trainer step ended."""
    clock: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """The fleet's busy seconds on its own clock (the capacity model's step durations) and on
    the wall, over the sample intervals an engine ran throughout."""
    update: float = 0.0
    """Seconds the trainer spent in weight updates (in ``driver.paused``)."""

    @property
    def rate(self) -> float:
        """Trainer steps per second."""
        return self.steps / self.wall

    @property
    def steady(self) -> float:
        """Trainer steps per second after the first step (the pipeline filled): a long run's rate."""
        ends = self.step_ends
        return (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 1 else self.rate

    @property
    def stretch(self) -> float:
        """Wall seconds per second of the fleet's clock (1: its steps take what they say)."""
        return self.clock[1] / self.clock[0] if self.clock[0] > 0 else 1.0

    @property
    def utilisation(self) -> float:
        return sum(s[1] for s in self.series) / max(len(self.series), 1)


def plot(outcomes: list[Outcome], path: Path, caption: str) -> str:
    """The series of every mode as an SVG (``_svg_plot``: no plotting library needed)."""
    base = next((o for o in outcomes if o.mode == "synchronous"), outcomes[0])
    panels = [
        Panel(
            f"{o.mode}: utilisation {o.utilisation:.0%}, {o.rate / base.rate:.1f}x over synchronous",
            [s[0] for s in o.series],
            [[100 * s[1] for s in o.series], [s[2] for s in o.series], [s[3] for s in o.series]],
            [s[4] for s in o.series],
        )
        for o in outcomes
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(svg(panels, caption))
    return f"plot: {path}"


def table(outcomes: list[Outcome]) -> list[str]:
    base = next((o for o in outcomes if o.mode == "synchronous"), outcomes[0])
    lines = [
        f"{'mode':<14}{'util':>6}{'tok/s':>8}{'tok/step':>9}{'steps/s':>9}{'speedup':>9}{'steady':>8}{'idle':>7}{'update':>8}{'in-flight':>10}"
        f"{'waiting':>9}{'clock':>7}{'on clock':>9}  staleness 0/1/2/>2 (mean)"
    ]
    for o in outcomes:
        total = sum(o.staleness.values()) or 1
        shares = " / ".join(f"{o.staleness[s] / total:.0%}" for s in range(3))
        over = sum(n for s, n in o.staleness.items() if s > 2) / total
        mean = sum(s * n for s, n in o.staleness.items()) / total
        n = max(len(o.series), 1)
        lines.append(
            f"{o.mode:<14}{o.utilisation:>6.0%}{o.tokens / o.wall:>8.0f}{o.tokens / max(o.steps, 1):>9.0f}{o.rate:>9.3f}"
            f"{o.rate / base.rate:>8.1f}x{o.steady / base.steady:>7.1f}x{o.idle / o.wall:>7.0%}{o.update / o.wall:>8.0%}"
            f"{sum(s[2] for s in o.series) / n:>10.0f}{sum(s[3] for s in o.series) / n:>9.1f}{o.stretch:>6.2f}x{o.rate * o.stretch / (base.rate * base.stretch):>8.1f}x"
            f"  {shares} / {over:.0%} ({mean:.2f})"
        )
    return lines
