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
from omniprobe.report.count_chart import (
    ROW_PX,
    count_axis,
    count_frame,
    finish,
    table_row,
    unit_grid,
)
from omniprobe.report.timeline_svg import (
    _label,
    dot_sample,
    series_group,
    series_style,
    straddle,
    swatch,
    title_lines,
)

_EDGE = 8  # the margin at the figure's left and right edges
_PLOT_H, _MIN_PLOT_W, _MIN_COLUMN_W = 200, 480, 90
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
    frame = count_frame(counts, names, [c for _, cells in rows for c in cells], edge=_EDGE,
                        min_plot_w=_MIN_PLOT_W, min_column_w=_MIN_COLUMN_W)
    left, plot_w, column_w, x = frame.left, frame.plot_w, frame.column_w, frame.x
    width = math.ceil(left + plot_w + 16)
    heading, title_y = title_lines(title, _EDGE, width - 2 * _EDGE)
    top = title_y + 16
    bottom = top + _PLOT_H
    table = bottom + 48
    y_top = max(curve.caps_mib) / 1024 * 1.15
    needs = {n: [curve.min_cap(f, n) for f in drawn] for n in counts}  # for straddle

    def y(gib: float) -> float:
        return top + _PLOT_H * (1 - gib / y_top)

    parts = [heading, *unit_grid(frame, y, y_top, 5, "GiB")]
    parts.append(series_group("caps tried", "".join(
        f'<line x1="{left:.1f}" x2="{left + plot_w:.1f}" y1="{y(cap / 1024):.1f}" '
        f'y2="{y(cap / 1024):.1f}"/>' for cap in curve.caps_mib), stroke=_CAPS, dash=_CAPS_DASH))
    parts += count_axis(frame, bottom, 31)
    parts.append(_label(_EDGE, table, "needs (GiB)", weight="bold"))
    for i, (flag_set, cells) in enumerate(rows):
        row_y = table + ROW_PX * (i + 1)
        sample = None
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
            sample = swatch(_EDGE, row_y, flag_set, stroke, dash)
        parts += table_row(frame, row_y, names[i], cells, edge=_EDGE, sample=sample)
    return finish(
        parts, [("caps tried", lambda kx, ky: swatch(kx, ky, "caps tried", _CAPS, _CAPS_DASH, 1)),
                ("a dot: the smallest cap tried that served the count",
                 lambda kx, ky: dot_sample(kx, ky, "#555"))], _NOTATION, width=width, edge=_EDGE,
        key_top=table + ROW_PX * (len(rows) + 1) + 6)
