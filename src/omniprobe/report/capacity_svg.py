"""The capacity curve as SVG text: minimum VRAM per reference count, one step line per flag set.

Pure and deterministic, like the timelines: same curve, same bytes. Every label lies outside the
plot: under it, a row per flag set reads what each count needs ("≤ 20": the smallest swept cap
that served it; "none ≤ 32": no swept cap did), so a value is never only a position to hover over;
a flag set that served no count has no line, and its legend entry says so.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from omniprobe.analysis.capacity_curve import CapacityCurve
from omniprobe.report.timeline_svg import _label, _ticks

_W = 720
_LEFT, _RIGHT, _TOP, _PLOT_H = 120, 200, 28, 200
_ROW = 15
_COLOURS = ("#1f5fbf", "#c0392b", "#27ae60", "#8e44ad", "#d68910", "#555555")


def _gib(mib: int) -> str:
    return f"{mib / 1024:g}"


def render_curve_svg(curve: CapacityCurve, *, title: str, verb: str = "served") -> str:
    """`verb`: what a count at a cap did, in the legend of a line with none (capacity-only
    evidence fits, it is never served)."""
    counts, flag_sets = curve.reference_counts, curve.flag_sets
    largest = _gib(max(curve.caps_mib))
    y_top = max(curve.caps_mib) / 1024 * 1.15
    plot_w = _W - _LEFT - _RIGHT
    x_step = plot_w / max(len(counts), 1)
    bottom = _TOP + _PLOT_H
    table = bottom + 40
    height = table + _ROW * (len(flag_sets) + 1) + 8
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
        f'viewBox="0 0 {_W} {height}" font-family="sans-serif" font-size="11">'
        "<style>.grid{stroke:#e5e5e5}.cap{stroke:#bbb;stroke-dasharray:2 3}"
        ".line{stroke-width:2}</style>"
        f'<text x="{_LEFT}" y="16" font-weight="bold">{escape(title)}</text>'
    )

    def x(count: int) -> float:
        return _LEFT + x_step * (counts.index(count) + 0.5)

    def y(gib: float) -> float:
        return _TOP + _PLOT_H * (1 - gib / y_top)

    parts = [head]
    for tick in _ticks(y_top, 5):
        parts.append(
            f'<line class="grid" x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}"/>'
        )
        parts.append(_label(_LEFT - 6, y(tick) + 4, f"{tick:g} GiB", "end"))
    for cap in curve.caps_mib:
        parts.append(
            f'<line class="cap" x1="{_LEFT}" x2="{_LEFT + plot_w}" '
            f'y1="{y(cap / 1024):.1f}" y2="{y(cap / 1024):.1f}"/>'
        )
    for count in counts:
        parts.append(_label(x(count), bottom + 16, str(count), "middle"))
    parts.append(_label(_LEFT + plot_w / 2, bottom + 30, "reference images", "middle"))
    parts.append(_label(_LEFT - 6, table, "needs (GiB)", "end"))
    for i, flag_set in enumerate(flag_sets):
        colour = _COLOURS[i % len(_COLOURS)]
        served = [(c, curve.min_cap(flag_set, c)) for c in counts]
        steps = []
        for count, cap in served:
            if cap is not None:
                steps += [(x(count) - x_step / 2, y(cap / 1024)), (x(count) + x_step / 2, y(cap / 1024))]
                parts.append(f'<circle cx="{x(count):.1f}" cy="{y(cap / 1024):.1f}" r="3" fill="{colour}"/>')
        if steps:
            coords = " ".join(f"{px:.1f},{py:.1f}" for px, py in steps)
            parts.append(f'<polyline class="line" fill="none" stroke="{colour}" points="{coords}"/>')
        row_y = table + _ROW * (i + 1)
        parts.append(_label(_LEFT - 6, row_y, flag_set, "end", colour))
        for count, cap in served:
            parts.append(
                _label(
                    x(count),
                    row_y,
                    f"≤ {_gib(cap)}" if cap is not None else f"none ≤ {largest}",
                    "middle",
                    colour,
                )
            )
        legend_y = _TOP + 14 + 16 * i
        if steps:
            parts.append(
                f'<line x1="{_W - _RIGHT + 12}" x2="{_W - _RIGHT + 30}" y1="{legend_y - 4}" '
                f'y2="{legend_y - 4}" stroke="{colour}" stroke-width="2"/>'
            )
            parts.append(_label(_W - _RIGHT + 36, legend_y, flag_set))
        else:
            parts.append(_label(_W - _RIGHT + 36, legend_y, f"{flag_set}: no count {verb}", fill=colour))
    return "".join(parts) + "</svg>\n"
