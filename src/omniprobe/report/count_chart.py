"""The frame both reference-count figures share, the capacity curve and the smallest pool: a
column per reference count, a y axis in one unit, a row per series under the plot that reads the
table's cells, and a key and its notation at the foot. What each plots is its own."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from omniprobe.report.timeline_svg import (
    SWATCH_PX,
    _label,
    _ticks,
    legend_flow,
    svg_head,
    text_px,
    wrap,
)

ROW_PX = 15  # a row of the table under the plot, and a line of the notation


@dataclass(frozen=True)
class CountFrame:
    """Where the plot lies across: `left` its left edge, a column of `column_w` per count."""

    counts: list[int]
    left: float
    column_w: float
    plot_w: float

    def x(self, count: int) -> float:
        return self.left + self.column_w * (self.counts.index(count) + 0.5)


def count_frame(counts: list[int], names: Sequence[str], cells: Sequence[str], *, edge: float,
                min_plot_w: float, min_column_w: float) -> CountFrame:
    """Wide enough for the longest row name left of the plot and the longest cell in a column."""
    left = max(70.0, edge + SWATCH_PX + 6 + max(map(text_px, names), default=0) + 12)
    column_w = max(min_column_w, max(map(text_px, cells), default=0) + 16)
    plot_w = max(min_plot_w, column_w * len(counts))
    return CountFrame(counts, left, plot_w / max(len(counts), 1), plot_w)


def unit_grid(frame: CountFrame, y_of: Callable[[float], float], top: float, ticks: int,
              unit: str) -> list[str]:
    """The horizontal grid lines, each labelled in `unit` left of the plot (the unit the figure's
    other labels use)."""
    parts = []
    for tick in _ticks(top, ticks):
        y = y_of(tick)
        parts.append(f'<line class="grid" x1="{frame.left:.1f}" x2="{frame.left + frame.plot_w:.1f}" '
                     f'y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(_label(frame.left - 6, y + 4, f"{tick:,g} {unit}", "end"))
    return parts


def count_axis(frame: CountFrame, bottom: float, title_gap: float) -> list[str]:
    """Each count under its column, and the axis's name `title_gap` below the plot."""
    return ([_label(frame.x(n), bottom + 16, str(n), "middle") for n in frame.counts]
            + [_label(frame.left + frame.plot_w / 2, bottom + title_gap, "reference images",
                      "middle")])


def table_row(frame: CountFrame, y: float, name: str, cells: Sequence[str], *, edge: float,
              sample: str | None) -> list[str]:
    """A series' row: its legend sample (None: it has no line), its name, a cell per count."""
    return ([sample] if sample else []) + [_label(edge + SWATCH_PX + 6, y, name)] + [
        _label(frame.x(n), y, cell, "middle") for n, cell in zip(frame.counts, cells, strict=True)]


def finish(parts: list[str], key: Sequence[tuple[str, Callable[[float, float], str]]],
           notation: str, *, width: int, edge: float, key_top: float) -> str:
    """The key and the wrapped notation under the table, and the figure closed at their foot."""
    drawn, key_y = legend_flow(key, edge, width - edge, key_top)
    lines = wrap(notation, width - 2 * edge)
    body = parts + drawn + [_label(edge, key_y + ROW_PX * (i + 1), line)
                            for i, line in enumerate(lines)]
    height = math.ceil(key_y + ROW_PX * len(lines) + 8)
    return svg_head(width, height) + "".join(body) + "</svg>\n"
