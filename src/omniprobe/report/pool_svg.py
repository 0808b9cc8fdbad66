"""The smallest memory pool per profile against the reference count, as SVG text: one line per
profile through each count's A (it fits at every trial at or above it), its band from B to A
shaded where it is uncertain, and each card's usable pool as a labelled horizontal line, marked
where a figure it comes from is assumed. One unit, MiB, on the axis and in every label.

Pure and deterministic: same figure, same bytes. Every label lies inside the view box: each card's
label in the right margin at its line's height (moved apart where two lines lie close); under the
plot a row per profile, its legend entry, reads each count's band in the words of the bands table
beside the figure (the caller passes the same cells to both, capacity_view.band_cell's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omniprobe.report.count_chart import ROW_PX, count_axis, count_frame, finish, table_row, unit_grid
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
ASSUMED = "*"  # after a card's label: a figure its pool comes from is assumed
_EDGE, _TOP_GAP, _PLOT_H = 8, 18, 260
_MIN_PLOT_W, _MIN_COLUMN_W = 480, 90
_INFERRED = ("; a B in parentheses was not tried at that count, it is the previous count's, and "
             "no band is shaded there")


def notation(b_inferred: bool) -> str:
    """The key's words under the table; the parentheses explained only where a cell has them."""
    return ("B–A (MiB): the count failed at every trial at or below B and fit at every trial at "
            f"or above A{_INFERRED if b_inferred else ''}. {ASSUMED} after a card: its pool "
            "rests on a figure hosts.toml [cards] marks assumed.")


@dataclass(frozen=True)
class PoolLine:
    """One profile: per reference count its band, (B, A) in MiB, None where a side is missing; and
    per count the bands table's cell, its row under the plot."""

    profile: str
    bands: tuple[tuple[int, int | None, int | None], ...]  # (count, B, A)
    cells: tuple[str, ...]  # by reference count, as the bands table reads them


@dataclass(frozen=True)
class CardLine:
    name: str  # e.g. "RTX 5080"
    usable_mib: int
    assumed: bool = False  # a figure its usable pool comes from is assumed

    @property
    def label(self) -> str:
        return f"{self.name}: {self.usable_mib:,} MiB" + (f" {ASSUMED}" if self.assumed else "")


def spread(positions: list[float], gap: float) -> list[float]:
    """Label heights at least `gap` apart, each as near its own line as that allows, in order."""
    out: list[float] = []
    for pos in positions:
        out.append(max(pos, out[-1] + gap) if out else pos)
    return out


BAND_OPACITY, BAND_HALF_PX = 0.18, 7  # a count alone in its band: this wide either side


def _band_sample(x: float, y: float) -> str:
    """The key's sample of a band, where a swatch would lie left of its words."""
    return (f'<rect data-legend="B to A" x="{x:.1f}" y="{y - 10:.1f}" width="{SWATCH_PX:.1f}" '
            f'height="11" fill="#555" opacity="{BAND_OPACITY}"/>')


def band_polygons(points: list[tuple[float, float | None, float | None]]) -> list[list[tuple]]:
    """The shaded band of one profile: over each run of neighbouring counts that have both B and
    A, the outline along A and back along B; a count alone is a short bar of its own width.
    `points`: (x, y of B, y of A) per count, in order."""
    runs: list[list[tuple[float, float, float]]] = [[]]
    for x, yb, ya in points:
        if yb is None or ya is None:
            runs.append([])
        else:
            runs[-1].append((x, yb, ya))
    shapes = []
    for run in (r for r in runs if r):
        if len(run) == 1:
            x, yb, ya = run[0]
            run = [(x - BAND_HALF_PX, yb, ya), (x + BAND_HALF_PX, yb, ya)]
        shapes.append([(x, ya) for x, _, ya in run] + [(x, yb) for x, yb, _ in reversed(run)])
    return shapes


def render_pool_svg(lines: list[PoolLine], cards: list[CardLine], counts: list[int], *,
                    title: str, b_inferred: bool = False) -> str:
    """Each profile's line has a colour of its own; where two have the same A at a count they lie
    side by side there (straddle), and their B–A bars stand side by side at every count.
    `b_inferred`: some cell gives the previous count's B in parentheses, and the key says so."""
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
                  + [c.usable_mib for c in cards] + [1024]) * 1.08

    def y(mib: float) -> float:
        return top + _PLOT_H * (1 - mib / top_mib)

    parts = [heading, *unit_grid(frame, y, top_mib, 6, "MiB"), *count_axis(frame, bottom, 32)]
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
        points, marks = [], []
        # A profile searched at one count only has no line to show it: its point is drawn
        # larger, ringed, so it is not lost among the lines through the same height.
        lone = sum(a is not None for _, _, a in line.bands) == 1
        ring = 'r="5" stroke="#ffffff" stroke-width="1.5"' if lone else 'r="3" stroke="none"'
        for count, _, a in line.bands:
            if a is not None:
                py = y(a) + straddle(fits[count], i)
                points.append((x(count), py))
                marks.append(f'<circle cx="{x(count):.1f}" cy="{py:.1f}" {ring} '
                             f'fill="{stroke}"/>')
        shapes = band_polygons([(x(n), None if b is None else y(b), None if a is None else y(a))
                                for n, b, a in line.bands])
        for shape in shapes:
            marks.insert(0, f'<polygon stroke="none" fill="{stroke}" opacity="{BAND_OPACITY}" '
                            'points="' + " ".join(f"{px:.1f},{py:.1f}" for px, py in shape)
                         + '"/>')
        if len(points) > 1:
            marks.append('<polyline fill="none" points="'
                         + " ".join(f"{px:.1f},{py:.1f}" for px, py in points) + '"/>')
        parts.append(series_group(line.profile, "".join(marks), stroke=stroke, dash=dash, width=2))
        row_y = table + ROW_PX * (i + 1)
        parts += table_row(frame, row_y, line.profile, line.cells, edge=_EDGE,
                           sample=swatch(_EDGE, row_y, line.profile, stroke, dash))
    return finish(parts, [(CARDS, lambda kx, ky: swatch(kx, ky, CARDS, CARD_COLOUR, CARD_DASH, 1.2)),
                          ("a point: A", lambda kx, ky: dot_sample(kx, ky, "#555")),
                          ("a shaded band: B up to A, uncertain", _band_sample)],
                  notation(b_inferred), width=width, edge=_EDGE,
                  key_top=table + ROW_PX * (len(lines) + 1) + 6)
