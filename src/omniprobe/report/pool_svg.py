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

CARD_COLOUR, CARD_DASH = "#777777", "5 3"
CARDS = "a card's usable pool"  # the card lines' series, each line named at its right end
_EDGE, _TOP_GAP, _PLOT_H, _ROW = 8, 18, 260, 15
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
    left = max(70.0, _EDGE + SWATCH_PX + 6 + max((text_px(p.profile) for p in lines), default=0)
               + 12)
    column_w = max(_MIN_COLUMN_W, max((text_px(c) for p in lines for c in p.cells), default=0) + 16)
    plot_w = max(_MIN_PLOT_W, column_w * len(counts))
    column_w = plot_w / max(len(counts), 1)
    right = max((text_px(c.label) for c in cards), default=0) + 10 + _EDGE
    width = math.ceil(left + plot_w + right)
    heading, title_y = title_lines(title, _EDGE, width - 2 * _EDGE)
    top = title_y + _TOP_GAP
    bottom = top + _PLOT_H
    table = bottom + 52
    top_mib = max([a or b or 0 for line in lines for _, b, a in line.bands]
                  + [c.usable_mib for c in cards] + [1024])
    y_top = top_mib / 1024 * 1.08

    def x(count: int) -> float:
        return left + column_w * (counts.index(count) + 0.5)

    def y(mib: float) -> float:
        return top + _PLOT_H * (1 - mib / 1024 / y_top)

    parts = [heading]
    for tick in _ticks(y_top, 6):
        parts.append(f'<line class="grid" x1="{left:.1f}" x2="{left + plot_w:.1f}" '
                     f'y1="{y(tick * 1024):.1f}" y2="{y(tick * 1024):.1f}"/>')
        parts.append(_label(left - 6, y(tick * 1024) + 4, f"{tick:g} GiB", "end"))
    for count in counts:
        parts.append(_label(x(count), bottom + 16, str(count), "middle"))
    parts.append(_label(left + plot_w / 2, bottom + 32, "reference images", "middle"))
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
        row_y = table + _ROW * (i + 1)
        parts.append(swatch(_EDGE, row_y, line.profile, stroke, dash))
        parts.append(_label(_EDGE + SWATCH_PX + 6, row_y, line.profile))
        parts += [_label(x(n), row_y, cell, "middle") for n, cell in zip(counts, line.cells,
                                                                         strict=True)]
    key, key_y = legend_flow(
        [(CARDS, lambda kx, ky: swatch(kx, ky, CARDS, CARD_COLOUR, CARD_DASH, 1.2)),
         ("a point: A", lambda kx, ky: dot_sample(kx, ky, "#555")),
         ("a pale bar: B up to A, uncertain", _bar_sample)],
        _EDGE, width - _EDGE, table + _ROW * (len(lines) + 1) + 6)
    notation = wrap(_NOTATION, width - 2 * _EDGE)
    parts += key
    parts += [_label(_EDGE, key_y + _ROW * (i + 1), text) for i, text in enumerate(notation)]
    height = math.ceil(key_y + _ROW * len(notation) + 8)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="{FONT_PX}">'
            "<style>.grid{stroke:#e5e5e5}</style>" + "".join(parts) + "</svg>\n")
