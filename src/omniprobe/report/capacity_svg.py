"""The capacity curve as SVG text: minimum VRAM per reference count, one step line per flag set.

Pure and deterministic, like the timelines: same curve, same bytes. Every label lies outside the
plot: under it, a row per flag set, its legend entry, reads what each count needs in the words of
the table beside the figure (`need_rows`, one function for both): "≤ 20" (the smallest cap tried
served it), "16–20" (16 did not, 20 did), "> 32" (no cap tried served it; 32 the largest tried),
"not run" (no cap was asked for it), so a value is never only a position to hover over; a flag set
that served no count has no line, and its row says so.
"""

from __future__ import annotations

import math

from omniprobe.analysis.capacity_curve import CapacityCurve, served_at
from omniprobe.analysis.diffusers_capacity import min_cap
from omniprobe.report.timeline_svg import (
    FONT_PX,
    SWATCH_PX,
    _label,
    _ticks,
    dot_sample,
    legend_flow,
    series_group,
    series_style,
    straddle,
    swatch,
    text_px,
    title_lines,
    wrap,
)

_EDGE = 8  # the margin at the figure's left and right edges
_PLOT_H, _MIN_PLOT_W, _MIN_COLUMN_W = 200, 480, 90
_ROW = 15
_CAPS, _CAPS_DASH = "#bbbbbb", "2 3"
_NOTATION = ("Needs (GiB): ≤ M, served at M, the smallest cap tried; N–M, not served at N, served "
             "at M; > N, served at no cap tried, N the largest; not run, asked at no cap.")


def need_text(curve: CapacityCurve, flag_set: str, reference_count: int) -> str:
    """What a count needs at a flag set, as the sweep measured it, in the figure and its table; in
    the words of the Diffusers sweep's table (MinCap.text), so the report has one notation."""
    return min_cap(served_at(curve, flag_set, reference_count)).text()


def need_rows(curve: CapacityCurve) -> list[tuple[str, list[str]]]:
    """Per flag set, what each reference count needs: the figure's rows and its table's cells."""
    return [(f, [need_text(curve, f, n) for n in curve.reference_counts]) for f in curve.flag_sets]


def _segments(points: list[tuple[float, float] | None]) -> list[list[tuple[float, float]]]:
    """Runs of consecutive served counts: a line never bridges a count that was not served."""
    runs: list[list[tuple[float, float]]] = [[]]
    for point in points:
        if point is None:
            runs.append([])
        else:
            runs[-1].append(point)
    return [run for run in runs if run]


def render_curve_svg(curve: CapacityCurve, *, title: str, verb: str = "served") -> str:
    """`verb`: what a count at a cap did, in the row of a flag set with no line (capacity-only
    evidence fits, it is never served). Each flag set's line has a colour of its own, and where
    two need the same cap they lie side by side (straddle), never as one."""
    counts, rows = curve.reference_counts, need_rows(curve)
    drawn = [f for f in curve.flag_sets if any(curve.min_cap(f, n) is not None for n in counts)]
    names = [f if f in drawn else f"{f}: no count {verb}" for f in curve.flag_sets]
    left = max(70.0, _EDGE + SWATCH_PX + 6 + max(map(text_px, names), default=0) + 12)
    column_w = max(_MIN_COLUMN_W, max((text_px(c) for _, cells in rows for c in cells),
                                      default=0) + 16)
    plot_w = max(_MIN_PLOT_W, column_w * len(counts))
    column_w = plot_w / max(len(counts), 1)
    width = math.ceil(left + plot_w + 16)
    heading, title_y = title_lines(title, _EDGE, width - 2 * _EDGE)
    top = title_y + 16
    bottom = top + _PLOT_H
    table = bottom + 48
    y_top = max(curve.caps_mib) / 1024 * 1.15
    needs = {n: [curve.min_cap(f, n) for f in drawn] for n in counts}  # for straddle

    def x(count: int) -> float:
        return left + column_w * (counts.index(count) + 0.5)

    def y(gib: float) -> float:
        return top + _PLOT_H * (1 - gib / y_top)

    parts = [heading]
    for tick in _ticks(y_top, 5):
        parts.append(f'<line class="grid" x1="{left:.1f}" x2="{left + plot_w:.1f}" '
                     f'y1="{y(tick):.1f}" y2="{y(tick):.1f}"/>')
        parts.append(_label(left - 6, y(tick) + 4, f"{tick:g} GiB", "end"))
    parts.append(series_group("caps tried", "".join(
        f'<line x1="{left:.1f}" x2="{left + plot_w:.1f}" y1="{y(cap / 1024):.1f}" '
        f'y2="{y(cap / 1024):.1f}"/>' for cap in curve.caps_mib), stroke=_CAPS, dash=_CAPS_DASH))
    for count in counts:
        parts.append(_label(x(count), bottom + 16, str(count), "middle"))
    parts.append(_label(left + plot_w / 2, bottom + 31, "reference images", "middle"))
    parts.append(_label(_EDGE, table, "needs (GiB)", weight="bold"))
    for i, (flag_set, cells) in enumerate(rows):
        row_y = table + _ROW * (i + 1)
        if flag_set in drawn:
            j = drawn.index(flag_set)
            stroke, dash = series_style(j)
            points = [None if (cap := curve.min_cap(flag_set, n)) is None
                      else (x(n), y(cap / 1024) + straddle(needs[n], j)) for n in counts]
            steps = "".join(
                '<polyline fill="none" points="' + " ".join(
                    f"{px + dx:.1f},{py:.1f}" for px, py in run for dx in (-column_w / 2,
                                                                            column_w / 2)) + '"/>'
                for run in _segments(points))
            dots = "".join(f'<circle cx="{p[0]:.1f}" cy="{p[1]:.1f}" r="3" fill="{stroke}" '
                           'stroke="none"/>' for p in points if p)
            parts.append(series_group(flag_set, steps + dots, stroke=stroke, dash=dash, width=2))
            parts.append(swatch(_EDGE, row_y, flag_set, stroke, dash))
        parts.append(_label(_EDGE + SWATCH_PX + 6, row_y, names[i]))
        parts += [_label(x(n), row_y, cell, "middle") for n, cell in zip(counts, cells,
                                                                         strict=True)]
    key_top = table + _ROW * (len(rows) + 1) + 6
    key, key_y = legend_flow(
        [("caps tried", lambda kx, ky: swatch(kx, ky, "caps tried", _CAPS, _CAPS_DASH, 1)),
         ("a dot: the smallest cap tried that served the count",
          lambda kx, ky: dot_sample(kx, ky, "#555"))], _EDGE, width - _EDGE, key_top)
    notation = wrap(_NOTATION, width - 2 * _EDGE)
    parts += key
    parts += [_label(_EDGE, key_y + _ROW * (i + 1), line) for i, line in enumerate(notation)]
    height = math.ceil(key_y + _ROW * len(notation) + 8)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="{FONT_PX}">'
            "<style>.grid{stroke:#e5e5e5}</style>" + "".join(parts) + "</svg>\n")
