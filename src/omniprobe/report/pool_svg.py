"""The smallest memory pool per profile against the reference count, as SVG text: one line per
profile through each count's A (it fits at every trial at or above it), a bar from B to A where
the band is uncertain, and each card's usable pool as a labelled horizontal line.

Pure and deterministic: same figure, same bytes. Every label lies inside the view box: each card's
label in the right margin at its line's height (moved apart where two lines lie close); under the
plot a row per profile, its legend entry, reads each count's band in the words of the bands table
beside the figure (the caller passes the same cells to both, capacity_view.band_cell's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omniprobe.report.count_chart import ROW_PX, count_axis, count_frame, finish, gib_grid, table_row
from omniprobe.report.timeline_svg import (
    SWATCH_PX,
    _label,
    dot_sample,
    series_group,
    series_style,
    straddle,
    swatch,
    text_px,
    title_lines,
)

CARD_COLOUR, CARD_DASH = "#777777", "5 3"
CARDS = "a card's usable pool"  # the card lines' series, each line named at its right end
_EDGE, _TOP_GAP, _PLOT_H = 8, 18, 260
_MIN_PLOT_W, _MIN_COLUMN_W = 480, 90
_NOTATION = ("B–A (MiB): the count failed at every trial at or below B and fit at every trial at "
             "or above A; a B in parentheses was not tried at that count, it is the previous "
             "count's.")


@dataclass(frozen=True)
class PoolLine:
    """One profile: per reference count its band, (B, A) in MiB, None where a side is missing; and
    per count the bands table's cell, its row under the plot."""

    profile: str
    bands: tuple[tuple[int, int | None, int | None], ...]  # (count, B, A)
    cells: tuple[str, ...]  # by reference count, as the bands table reads them


@dataclass(frozen=True)
class CardLine:
    label: str  # e.g. "RTX 5080: 15,872 MiB usable"
    usable_mib: int


def spread(positions: list[float], gap: float) -> list[float]:
    """Label heights at least `gap` apart, each as near its own line as that allows, in order."""
    out: list[float] = []
    for pos in positions:
        out.append(max(pos, out[-1] + gap) if out else pos)
    return out


def _bar_sample(x: float, y: float) -> str:
    """The key's sample of a B–A bar, where a swatch would lie left of its words."""
    mid = x + SWATCH_PX / 2
    return (f'<line data-legend="B to A" x1="{mid:.1f}" x2="{mid:.1f}" y1="{y - 10:.1f}" '
            f'y2="{y + 1:.1f}" stroke="#555" stroke-width="3" opacity="0.45"/>')


def render_pool_svg(lines: list[PoolLine], cards: list[CardLine], counts: list[int], *,
                    title: str) -> str:
    """Each profile's line has a colour of its own; where two have the same A at a count they lie
    side by side there (straddle), and their B–A bars stand side by side at every count."""
    frame = count_frame(counts, [p.profile for p in lines], [c for p in lines for c in p.cells],
                        edge=_EDGE, min_plot_w=_MIN_PLOT_W, min_column_w=_MIN_COLUMN_W)
    left, plot_w, x = frame.left, frame.plot_w, frame.x
    right = max((text_px(c.label) for c in cards), default=0) + 10 + _EDGE
    width = math.ceil(left + plot_w + right)
    heading, title_y = title_lines(title, _EDGE, width - 2 * _EDGE)
    top = title_y + _TOP_GAP
    bottom = top + _PLOT_H
    table = bottom + 52
    top_mib = max([a or b or 0 for line in lines for _, b, a in line.bands]
                  + [c.usable_mib for c in cards] + [1024])
    y_top = top_mib / 1024 * 1.08

    def y(mib: float) -> float:
        return top + _PLOT_H * (1 - mib / 1024 / y_top)

    parts = [heading, *gib_grid(frame, lambda gib: y(gib * 1024), y_top, 6),
             *count_axis(frame, bottom, 32)]
    ordered = sorted(cards, key=lambda c: -c.usable_mib)  # top to bottom
    parts.append(series_group(CARDS, "".join(
        f'<line x1="{left:.1f}" x2="{left + plot_w + 6:.1f}" y1="{y(c.usable_mib):.1f}" '
        f'y2="{y(c.usable_mib):.1f}"/>' for c in ordered), stroke=CARD_COLOUR, dash=CARD_DASH,
        width=1.2))
    heights = spread([y(c.usable_mib) + 4 for c in ordered], 13)
    for card, label_y in zip(ordered, heights, strict=True):
        parts.append(_label(left + plot_w + 10, label_y, card.label, fill=CARD_COLOUR))
    fits = {n: [dict((c, a) for c, _, a in line.bands).get(n) for line in lines] for n in counts}
    parts.append(_label(_EDGE, table, "B–A (MiB)", weight="bold"))
    for i, line in enumerate(lines):
        stroke, dash = series_style(i)
        shift = (i - (len(lines) - 1) / 2) * 4  # side by side, so no bar hides another
        points, marks = [], []
        for count, b, a in line.bands:
            px = x(count) + shift
            if a is not None:
                py = y(a) + straddle(fits[count], i)
                points.append((px, py))
                marks.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{stroke}" '
                             'stroke="none"/>')
            if a is not None and b is not None:
                marks.append(f'<line stroke-width="3" opacity="0.45" stroke-dasharray="none" '
                             f'x1="{px:.1f}" x2="{px:.1f}" y1="{y(b):.1f}" y2="{y(a):.1f}"/>')
        if len(points) > 1:
            marks.insert(0, '<polyline fill="none" points="'
                         + " ".join(f"{px:.1f},{py:.1f}" for px, py in points) + '"/>')
        parts.append(series_group(line.profile, "".join(marks), stroke=stroke, dash=dash, width=2))
        row_y = table + ROW_PX * (i + 1)
        parts += table_row(frame, row_y, line.profile, line.cells, edge=_EDGE,
                           sample=swatch(_EDGE, row_y, line.profile, stroke, dash))
    return finish(parts, [(CARDS, lambda kx, ky: swatch(kx, ky, CARDS, CARD_COLOUR, CARD_DASH, 1.2)),
                          ("a point: A", lambda kx, ky: dot_sample(kx, ky, "#555")),
                          ("a pale bar: B up to A, uncertain", _bar_sample)],
                  _NOTATION, width=width, edge=_EDGE,
                  key_top=table + ROW_PX * (len(lines) + 1) + 6)
