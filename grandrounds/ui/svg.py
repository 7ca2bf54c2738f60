"""Inline SVG line charts for the web view: no JavaScript, no image files, text that a test can
read (every series carries a `data-series` name and its points)."""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


@dataclass
class Series:
    name: str
    ys: list[float]
    color: str | None = None
    width: float = 1.5
    dash: str | None = None
    opacity: float = 1.0


@dataclass
class Band:
    name: str
    lo: list[float]
    hi: list[float]
    color: str = "#1f77b4"
    opacity: float = 0.2


@dataclass
class Chart:
    title: str
    y_label: str
    x_label: str = "cases processed"
    series: list[Series] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    y_min: float | None = 0.0
    y_max: float | None = None
    width: int = 900
    height: int = 280


def _fmt(v: float) -> str:
    return f"{v:.1f}"


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def render(chart: Chart) -> str:
    """The chart as an <svg> element (a string to insert unescaped)."""
    left, right, top, bottom = 52, 180, 26, 40
    w, h = chart.width, chart.height
    pw, ph = w - left - right, h - top - bottom
    all_y = [y for s in chart.series for y in s.ys] + [y for b in chart.bands for y in b.lo + b.hi]
    n = max([len(s.ys) for s in chart.series] + [len(b.lo) for b in chart.bands] + [1])
    y_lo = chart.y_min if chart.y_min is not None else (min(all_y) if all_y else 0.0)
    y_hi = chart.y_max if chart.y_max is not None else (max(all_y) if all_y else 1.0)
    if y_hi <= y_lo:
        y_hi = y_lo + 1.0

    def x(i: int) -> float:  # point i is case i+1
        return left + (pw * i / (n - 1) if n > 1 else pw / 2)

    def y(v: float) -> float:
        return top + ph - ph * (v - y_lo) / (y_hi - y_lo)

    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'viewBox="0 0 {w} {h}" role="img" aria-label="{escape(chart.title)}">',
           f'<text x="{left}" y="16" class="chart-title">{escape(chart.title)}</text>',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fff" stroke="#ccc"/>']
    integral = chart.y_max is None and all(float(v).is_integer() for v in all_y)
    for t in _ticks(y_lo, y_hi):
        label = f"{t:.0f}" if integral else f"{t:.2f}"
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{_fmt(y(t))}" y2="{_fmt(y(t))}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{_fmt(y(t) + 4)}" text-anchor="end" class="tick">{label}</text>')
    for i in sorted({0, (n - 1) // 4, (n - 1) // 2, 3 * (n - 1) // 4, n - 1}):
        out.append(f'<text x="{_fmt(x(i))}" y="{top + ph + 16}" text-anchor="middle" class="tick">{i + 1}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{h - 6}" text-anchor="middle" class="axis">{escape(chart.x_label)}</text>'
               f'<text x="14" y="{top + ph / 2}" text-anchor="middle" class="axis" '
               f'transform="rotate(-90 14 {top + ph / 2})">{escape(chart.y_label)}</text>')
    legend = []
    for b in chart.bands:
        if not b.lo:
            continue
        pts = [f"{_fmt(x(i))},{_fmt(y(v))}" for i, v in enumerate(b.hi)]
        pts += [f"{_fmt(x(i))},{_fmt(y(v))}" for i, v in reversed(list(enumerate(b.lo)))]
        out.append(f'<polygon data-band="{escape(b.name)}" points="{" ".join(pts)}" fill="{b.color}" '
                   f'fill-opacity="{b.opacity}" stroke="none"/>')
        legend.append((b.name, b.color, None, b.opacity, True))
    for k, s in enumerate(chart.series):
        color = s.color or PALETTE[k % len(PALETTE)]
        if not s.ys:
            continue
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        if len(s.ys) == 1:  # one case: a dot, not an invisible zero-length line
            out.append(f'<circle data-series="{escape(s.name)}" cx="{_fmt(x(0))}" cy="{_fmt(y(s.ys[0]))}" r="3" '
                       f'fill="{color}"/>')
        else:
            pts = " ".join(f"{_fmt(x(i))},{_fmt(y(v))}" for i, v in enumerate(s.ys))
            out.append(f'<polyline data-series="{escape(s.name)}" points="{pts}" fill="none" stroke="{color}" '
                       f'stroke-width="{s.width}" stroke-opacity="{s.opacity}"{dash}/>')
        legend.append((s.name, color, s.dash, s.opacity, False))
    for j, (name, color, dash, opacity, is_band) in enumerate(legend[:14]):
        ly = top + 8 + 16 * j
        lx = left + pw + 10
        if is_band:
            out.append(f'<rect x="{lx}" y="{ly - 5}" width="18" height="10" fill="{color}" fill-opacity="{opacity}"/>')
        else:
            d = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(f'<line x1="{lx}" x2="{lx + 18}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{d}/>')
        out.append(f'<text x="{lx + 24}" y="{ly + 4}" class="legend">{escape(name[:22])}</text>')
    out.append("</svg>")
    return "".join(out)
