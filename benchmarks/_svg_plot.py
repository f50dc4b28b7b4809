"""A time-series plot as a small SVG, written by hand (a few polylines and rectangles).

``bench_fleet.py`` plots the fleet's utilisation, rollouts in flight and requests waiting over
time, one panel per mode, with the trainer's training and weight-update phases shaded. The
docs carry the file (docs/img/bench_fleet.svg), so it is text, small and needs no plotting
library: the package and the test extra stay free of matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

WIDTH, PANEL, LEFT, RIGHT, TOP, BOTTOM = 820, 170, 46, 14, 26, 36
LINES = (("utilisation %", "#1f77b4"), ("rollouts in flight", "#ff7f0e"), ("requests waiting", "#2ca02c"))
PHASES = {"train": "#e8e8e8", "update": "#f7c6c6"}
MAX_POINTS = 300
"""Points per line at most (every n-th sample): the file stays a few tens of KB."""


@dataclass
class Panel:
    title: str
    t: Sequence[float]
    """Seconds since the mode's start, one per sample."""
    lines: Sequence[Sequence[float]]
    """One series per ``LINES`` entry, as long as ``t``."""
    phases: Sequence[str]
    """The trainer's phase at each sample (``PHASES`` are shaded)."""


def _nice(top: float) -> float:
    """The smallest of 1, 2, 5 x 10^k at or above ``top``."""
    step = 1.0
    while step * 10 < top:
        step *= 10
    return next(m * step for m in (1, 2, 5, 10) if m * step >= top)


def svg(panels: list[Panel], caption: str) -> str:
    """The panels stacked, on one time axis and one value axis (so the modes compare)."""
    longest = max((p.t[-1] for p in panels if p.t), default=1.0)
    tick = _nice(longest / 5)
    t_max = tick * math.ceil(longest / tick)
    y_max = _nice(max([100.0, *(v for p in panels for line in p.lines for v in line)]))
    height = TOP + 22 + len(panels) * (PANEL + BOTTOM)
    plot_w = WIDTH - LEFT - RIGHT
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{LEFT}" y="14" font-size="12">{escape(caption)}</text>',
    ]
    x = LEFT + plot_w - 4
    for name, color in reversed([*LINES, *(("training", PHASES["train"]), ("weight update", PHASES["update"]))]):
        width = 7 * len(name) + 18
        x -= width
        out.append(f'<rect x="{x}" y="{TOP - 4}" width="10" height="3" fill="{color}"/>')
        out.append(f'<text x="{x + 13}" y="{TOP}">{escape(name)}</text>')
    for i, panel in enumerate(panels):
        top = TOP + 22 + i * (PANEL + BOTTOM)

        def px(t: float) -> float:
            return LEFT + plot_w * t / t_max

        def py(v: float, top: int = top) -> float:
            return top + PANEL - PANEL * v / y_max

        # The trainer's phases as bands behind the lines: a run of equal phases, one rectangle.
        start = 0
        for j in range(1, len(panel.t) + 1):
            if j == len(panel.t) or panel.phases[j] != panel.phases[start]:
                color = PHASES.get(panel.phases[start])
                if color is not None:
                    end = panel.t[j] if j < len(panel.t) else panel.t[-1]
                    x0 = px(panel.t[start])
                    out.append(
                        f'<rect x="{x0:.1f}" y="{top}" width="{max(px(end) - x0, 0.5):.1f}" '
                        f'height="{PANEL}" fill="{color}"/>'
                    )
                start = j
        out.append(f'<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL}" fill="none" stroke="#888"/>')
        for frac in (0.0, 0.5, 1.0):
            y = py(frac * y_max)
            out.append(f'<text x="{LEFT - 4}" y="{y + 4:.0f}" text-anchor="end">{frac * y_max:g}</text>')
        for k in range(round(t_max / tick) + 1):
            t = tick * k
            out.append(f'<text x="{px(t):.0f}" y="{top + PANEL + 13}" text-anchor="middle">{t:g} s</text>')
        out.append(f'<text x="{LEFT}" y="{top - 5}" font-weight="bold">{escape(panel.title)}</text>')
        stride = max(1, -(-len(panel.t) // MAX_POINTS))
        for (_, color), line in zip(LINES, panel.lines, strict=True):
            points = " ".join(f"{px(t):.1f},{py(v):.1f}" for t, v in list(zip(panel.t, line))[::stride])
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.2" points="{points}"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
