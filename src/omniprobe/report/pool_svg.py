"""The smallest memory pool per profile against the reference count, as SVG text: one line per
profile through each count's A (it fits at every trial at or above it), a bar from B to A where
the band is uncertain, and each card's usable pool as a labelled horizontal line.

Pure and deterministic: same figure, same bytes. Every label lies inside the view box: each card's
label in the right margin at its line's height (moved apart where two lines lie close), the
profiles' legend under the plot, one row each.
"""

from __future__ import annotations

from dataclasses import dataclass
from xml.sax.saxutils import escape

from omniprobe.report.timeline_svg import _label, _ticks

# Ten colours told apart in print and by most colour-blind readers (Tableau 10).
PROFILE_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
                   "#ff9da7", "#9c755f", "#17becf")
CARD_COLOUR = "#777777"
_W, _LEFT, _RIGHT, _TOP, _PLOT_H, _ROW = 760, 70, 250, 34, 260, 15


@dataclass(frozen=True)
class PoolLine:
    """One profile: per reference count its band, (B, A) in MiB; None where a side is missing."""

    profile: str
    bands: tuple[tuple[int, int | None, int | None], ...]  # (count, B, A)


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


def render_pool_svg(lines: list[PoolLine], cards: list[CardLine], counts: list[int], *,
                    title: str) -> str:
    plot_w = _W - _LEFT - _RIGHT
    top_mib = max([a or b or 0 for line in lines for _, b, a in line.bands]
                  + [c.usable_mib for c in cards] + [1024])
    y_top = top_mib / 1024 * 1.08
    bottom = _TOP + _PLOT_H
    legend_top = bottom + 52
    height = legend_top + _ROW * (len(lines) + 1) + 8
    x_step = plot_w / max(len(counts), 1)

    def x(count: int) -> float:
        return _LEFT + x_step * (counts.index(count) + 0.5)

    def y(mib: float) -> float:
        return _TOP + _PLOT_H * (1 - mib / 1024 / y_top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
             f'viewBox="0 0 {_W} {height}" font-family="sans-serif" font-size="11">'
             "<style>.grid{stroke:#e5e5e5}.card{stroke-dasharray:5 3;stroke-width:1.2}"
             "</style>"
             f'<text x="{_LEFT}" y="16" font-weight="bold">{escape(title)}</text>']
    for tick in _ticks(y_top, 6):
        parts.append(f'<line class="grid" x1="{_LEFT}" x2="{_LEFT + plot_w}" '
                     f'y1="{y(tick * 1024):.1f}" y2="{y(tick * 1024):.1f}"/>')
        parts.append(_label(_LEFT - 6, y(tick * 1024) + 4, f"{tick:g} GiB", "end"))
    for count in counts:
        parts.append(_label(x(count), bottom + 16, str(count), "middle"))
    parts.append(_label(_LEFT + plot_w / 2, bottom + 32, "reference images", "middle"))
    ordered = sorted(cards, key=lambda c: -c.usable_mib)  # top to bottom
    heights = spread([y(c.usable_mib) + 4 for c in ordered], 13)
    for card, label_y in zip(ordered, heights, strict=True):
        line_y = y(card.usable_mib)
        parts.append(f'<line class="card" stroke="{CARD_COLOUR}" x1="{_LEFT}" '
                     f'x2="{_LEFT + plot_w + 6}" y1="{line_y:.1f}" y2="{line_y:.1f}"/>')
        parts.append(_label(_LEFT + plot_w + 10, label_y, card.label, fill=CARD_COLOUR))
    for i, line in enumerate(lines):
        colour = PROFILE_COLOURS[i % len(PROFILE_COLOURS)]
        shift = (i - (len(lines) - 1) / 2) * 4  # side by side, so no bar hides another
        points = []
        for count, b, a in line.bands:
            px = x(count) + shift
            if a is not None:
                points.append((px, y(a)))
                parts.append(f'<circle cx="{px:.1f}" cy="{y(a):.1f}" r="3" fill="{colour}"/>')
            if a is not None and b is not None:
                parts.append(f'<line stroke="{colour}" stroke-width="3" opacity="0.45" '
                             f'x1="{px:.1f}" x2="{px:.1f}" y1="{y(b):.1f}" y2="{y(a):.1f}"/>')
        # Every other line dashed, and each drawn thinner than the one before: two profiles
        # with the same need still show as two lines, the later inside the earlier.
        dash = ' stroke-dasharray="7 4"' if i % 2 else ""
        width = 2 + 0.6 * (len(lines) - 1 - i)
        if len(points) > 1:
            coords = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="{width:g}"'
                         f'{dash} points="{coords}"/>')
        row_y = legend_top + _ROW * i
        parts.append(f'<line x1="{_LEFT}" x2="{_LEFT + 18}" y1="{row_y - 4}" '
                     f'y2="{row_y - 4}" stroke="{colour}" stroke-width="2"{dash}/>')
        parts.append(_label(_LEFT + 24, row_y, line.profile))
    parts.append(_label(_LEFT, legend_top + _ROW * len(lines),
                        "a point: A, fits at every trial at or above it; a pale bar: from B up to "
                        "A, uncertain; a dashed grey line: a card's usable pool", fill=CARD_COLOUR))
    return "".join(parts) + "</svg>\n"
