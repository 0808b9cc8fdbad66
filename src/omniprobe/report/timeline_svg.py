"""A VRAM timeline as SVG text, from a recorded series: pure functions, standard library only.

`render_svg` draws the device's used memory and the server's own, marks the peak, and optionally
the card's capacity and when requests were sent, each request numbered with a legend below. Same
input, same bytes: the report can be checked for staleness.

The figure helpers the report's other figures share live here too: one estimate of a label's
width (every margin, column and wrap is laid out by it, and tests/test_figures.py checks by it),
one palette, and one way to draw a series and its legend swatch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from xml.sax.saxutils import escape

from omniprobe.evidence.models.runs import TimelinePoint

FONT_PX = 11  # every figure's font size, set once on its <svg>
CHAR_EM = 0.6  # an estimated glyph width, in font sizes: sans-serif averages about that
# Okabe and Ito's eight colours, told apart by most colour-blind readers, yellow last as it is
# faint on white; then a brown and an indigo, so each of the Qwen pool figure's profiles has one.
SERIES_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
                  "#F0E442", "#8C510A", "#332288")
_W, _PLOT_H = 720, 192
_LEFT, _RIGHT = 64, 24  # the right margin holds half the last time tick's label
_TITLE_ROW = 14  # one more line of a wrapped title
_ROW = 13  # one row of request numbers, or one legend line
SWATCH_PX = 18  # the length of a legend entry's sample of its line
_DEVICE, _REQUESTS, _PEAK, _CAPACITY = "#999999", SERIES_COLOURS[3], SERIES_COLOURS[1], "#000000"


def text_px(text: str, font_px: float = FONT_PX) -> float:
    """A label's estimated width; the figures know no font metrics, so they leave room by this."""
    return len(text) * font_px * CHAR_EM


def wrap(text: str, width_px: float) -> list[str]:
    """Text in lines no wider than width_px, broken at spaces; a word wider than that keeps a line
    of its own (a figure widens to its longest word)."""
    lines: list[str] = []
    for word in text.split():
        if lines and text_px(f"{lines[-1]} {word}") <= width_px:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines or [""]


def series_style(index: int) -> tuple[str, str | None]:
    """The stroke colour and dash pattern of a figure's index-th series: a colour each while the
    palette lasts, then the colours again with a longer dash each round, so no two series share
    a look and, while the palette lasts, none shares a colour."""
    rounds, colour = divmod(index, len(SERIES_COLOURS))
    return SERIES_COLOURS[colour], (f"{3 * rounds + 3} 3" if rounds else None)


def _dash(dash: str | None) -> str:
    return f' stroke-dasharray="{dash}"' if dash else ""


def series_group(name: str, body: str, *, stroke: str | None = None, dash: str | None = None,
                 fill: str | None = None, width: float | None = None) -> str:
    """One plotted series as a group that names it: its lines take their colour, dash and width
    from it (never text, which would take the stroke too), so the figure test reads each series'
    look in one place."""
    look = ((f' stroke="{stroke}"' if stroke else "") + (f' fill="{fill}"' if fill else "")
            + (f' stroke-width="{width:g}"' if width else ""))
    return f'<g data-series="{escape(name)}"{look}{_dash(dash)}>{body}</g>'


def swatch(x: float, y: float, name: str, stroke: str, dash: str | None = None,
           width: float = 2) -> str:
    """A legend entry's sample of a series' line, ending left of its name at x + SWATCH_PX + 6;
    `y`: the name's baseline."""
    return (f'<line data-legend="{escape(name)}" x1="{x:.1f}" x2="{x + SWATCH_PX:.1f}" '
            f'y1="{y - 4:.1f}" y2="{y - 4:.1f}" stroke="{stroke}" stroke-width="{width:g}"'
            f"{_dash(dash)}/>")


def dot_sample(x: float, y: float, fill: str, name: str | None = None) -> str:
    """A legend entry's sample dot, centred where a swatch would lie; `name`: the series it
    stands for, where it stands for one."""
    named = f' data-legend="{escape(name)}"' if name else ""
    return f'<circle{named} cx="{x + SWATCH_PX / 2:.1f}" cy="{y - 4:.1f}" r="3.5" fill="{fill}"/>'


def straddle(values: Sequence[object], index: int, gap_px: float = 3,
             spread_px: float = 12) -> float:
    """How far (px) the index-th line lies from its value at a point: the lines of one value
    straddle it gap_px apart, in order, so two equal lines show as two, and never more than
    spread_px across, so none strays far from the value it shows; a value no other line shares
    lies on itself."""
    same = [i for i, v in enumerate(values) if v == values[index]]
    gap = min(gap_px, spread_px / max(len(same) - 1, 1))
    return (same.index(index) - (len(same) - 1) / 2) * gap


def _nice_step(span: float, ticks: int) -> float:
    raw = span / max(ticks, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)


def _ticks(top: float, count: int) -> list[float]:
    step = _nice_step(top, count)
    return [round(i * step, 6) for i in range(int(top / step + 1e-9) + 1)]


def _label(x: float, y: float, text: str, anchor: str = "start", fill: str | None = None,
           weight: str | None = None) -> str:
    """Text over a white halo, drawn as two copies so that every SVG renderer shows it."""
    at = f'x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"' + (
        f' font-weight="{weight}"' if weight else "")
    colour = f' fill="{fill}"' if fill else ""
    return (f'<text {at} stroke="#fff" stroke-width="3" fill="#fff">{escape(text)}</text>'
            f"<text {at}{colour}>{escape(text)}</text>")


def title_lines(title: str, x: float, width_px: float) -> tuple[str, float]:
    """The bold title, wrapped to width_px, and the baseline of its last line."""
    lines = wrap(title, width_px)
    parts = [f'<text x="{x:.1f}" y="{16 + _TITLE_ROW * i}" font-weight="bold">{escape(line)}</text>'
             for i, line in enumerate(lines)]
    return "".join(parts), 16 + _TITLE_ROW * (len(lines) - 1)


def legend_flow(entries: Sequence[tuple[str, Callable[[float, float], str]]], left: float,
                right: float, top: float) -> tuple[list[str], float]:
    """Legend entries (name, what draws its sample at a name's x and baseline) side by side from
    `left`, a new row where one would pass `right`; the SVG and the baseline of the last row."""
    parts, x, y = [], left, top
    for name, sample in entries:
        entry_w = SWATCH_PX + 6 + text_px(name)
        if x > left and x + entry_w > right:
            x, y = left, y + _ROW + 2
        parts.append(sample(x, y) + _label(x + SWATCH_PX + 6, y, name))
        x += entry_w + 16
    return parts, y


def _polyline(points: list[tuple[float, float]], css: str) -> str:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return f'<polyline class="{css}" fill="none" points="{coords}"/>'


def marker_rows(xs: Sequence[float], widths: Sequence[float], gap: float = 4.0) -> list[int]:
    """The row of each marker's number: the first row whose last label ends left of it, so that
    no two numbers overlap however close their requests were sent."""
    ends: list[float] = []
    rows = []
    for x, width in zip(xs, widths, strict=True):
        left = x - width / 2
        row = next((i for i, end in enumerate(ends) if end + gap <= left), len(ends))
        if row == len(ends):
            ends.append(0.0)
        ends[row] = x + width / 2
        rows.append(row)
    return rows


def render_svg(points: Sequence[TimelinePoint], *, title: str,
               capacity_mib: float | None = None, markers: Sequence[tuple[float, str]] = (),
               note: str | None = None) -> str:
    """SVG text of the series: device memory (grey, wide, under), the server's (blue), its peak
    (dot), each named in a legend under the plot.

    Every label lies outside the plot, so none can overprint a trace: the peak and the capacity in
    the header, each request as a number in rows above the plot, and the numbers' legend below.
    The figure widens to its longest request label or word, so no label is cut."""
    markers = sorted(markers)
    legend = [f"{i + 1} {label}" for i, (_, label) in enumerate(markers)]
    words = [*legend, *title.split(), *(note or "").split()]
    width = max(_W, math.ceil(_LEFT + _RIGHT + max(map(text_px, words), default=0)))
    plot_w = width - _LEFT - _RIGHT
    heading, title_y = title_lines(title, _LEFT, plot_w)
    if not points:
        lines = wrap(note or "no memory samples", plot_w)
        height = math.ceil(title_y + 18 + _ROW * len(lines))
        return (svg_head(width, height) + heading
                + "".join(f'<text x="{_LEFT}" y="{title_y + 18 + _ROW * i}">{escape(line)}</text>'
                          for i, line in enumerate(lines)) + "</svg>\n")
    t_max = max(p.t_s for p in points) or 1.0
    values = [p.device_mib for p in points] + [p.process_mib or 0 for p in points]
    y_max = max([*values, capacity_mib or 0]) * 1.05 or 1.0

    def x(t: float) -> float:
        return _LEFT + plot_w * t / t_max

    owned = [p for p in points if p.process_mib is not None]
    peak = max(owned, key=lambda p: p.process_mib) if owned else max(
        points, key=lambda p: p.device_mib)
    peak_mib = peak.process_mib if owned else peak.device_mib
    peak_text = f"peak {peak_mib:,.0f} MiB at {peak.t_s:.1f} s"
    capacity_text = f"capacity {capacity_mib:,.0f} MiB" if capacity_mib else ""
    info_y = title_y + 14
    capacity_y = info_y + (_ROW if text_px(peak_text) + text_px(capacity_text) + 16 > plot_w else 0)
    numbers = [str(i + 1) for i in range(len(markers))]
    rows = marker_rows([x(t) for t, _ in markers], [text_px(n) for n in numbers])
    head = capacity_y + 4
    top = head + ((max(rows) + 1) * _ROW if rows else 0)
    bottom = top + _PLOT_H

    def y(mib: float) -> float:
        return top + _PLOT_H * (1 - mib / y_max)

    key = [("device used", lambda kx, ky: swatch(kx, ky, "device used", _DEVICE, width=3))]
    if owned:
        key.append(("server processes",
                    lambda kx, ky: swatch(kx, ky, "server processes", SERIES_COLOURS[0])))
    key.append(("peak", lambda kx, ky: dot_sample(kx, ky, _PEAK, "peak")))
    if capacity_mib:
        key.append(("capacity", lambda kx, ky: swatch(kx, ky, "capacity", _CAPACITY, "4 3", 1)))
    if markers:
        key.append(("requests, numbered above",
                    lambda kx, ky: swatch(kx, ky, "requests", _REQUESTS, "1 2", 1)))
    key_parts, key_y = legend_flow(key, _LEFT, width - _RIGHT, bottom + 34)
    note_lines = wrap(note, plot_w) if note else []
    columns = max(1, int(plot_w // (max(map(text_px, legend), default=1) + 16)))
    legend_top = key_y + _ROW * len(note_lines)
    height = math.ceil(legend_top + -(-len(legend) // columns) * _ROW + 8)

    parts = [svg_head(width, height), heading]
    for gib in _ticks(y_max / 1024, 5):
        parts.append(f'<line class="grid" x1="{_LEFT}" x2="{width - _RIGHT}" y1="{y(gib * 1024):.1f}"'
                     f' y2="{y(gib * 1024):.1f}"/><text x="{_LEFT - 6}" y="{y(gib * 1024) + 4:.1f}"'
                     f' text-anchor="end">{gib:g} GiB</text>')
    for t in _ticks(t_max, 6):
        parts.append(f'<text x="{x(t):.1f}" y="{bottom + 16}" text-anchor="middle">{t:g} s</text>')
    marks = "".join(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{bottom}">'
                    f"<title>{escape(label)}</title></line>" for t, label in markers)
    if markers:
        parts.append(series_group("requests", marks, stroke=_REQUESTS, dash="1 2"))
    for (t, _), number, row in zip(markers, numbers, rows, strict=True):
        parts.append(_label(x(t), head + (row + 1) * _ROW - 3, number, "middle", "#555"))
    if capacity_mib:
        parts.append(series_group("capacity", f'<line x1="{_LEFT}" x2="{width - _RIGHT}" '
                                              f'y1="{y(capacity_mib):.1f}" y2="{y(capacity_mib):.1f}"/>',
                                  stroke=_CAPACITY, dash="4 3"))
        parts.append(_label(width - _RIGHT, capacity_y, capacity_text, "end"))
    # The device line wide and under the server's: where the two are one, its grey edges show.
    parts.append(series_group(
        "device used", _polyline([(x(p.t_s), y(p.device_mib)) for p in points], "device"),
        stroke=_DEVICE, width=3))
    if owned:
        parts.append(series_group(
            "server processes", _polyline([(x(p.t_s), y(p.process_mib)) for p in owned], "process"),
            stroke=SERIES_COLOURS[0], width=1.5))
    parts.append(series_group("peak", f'<circle cx="{x(peak.t_s):.1f}" cy="{y(peak_mib):.1f}" '
                                      'r="3.5"/>', fill=_PEAK))
    parts.append(_label(_LEFT, info_y, peak_text))
    parts += key_parts
    for i, line in enumerate(note_lines):
        parts.append(f'<text x="{_LEFT}" y="{key_y + _ROW * (i + 1)}">{escape(line)}</text>')
    column_w = plot_w / columns
    for i, text in enumerate(legend):
        row, column = divmod(i, columns)
        parts.append(f'<text x="{_LEFT + column * column_w:.1f}" y="{legend_top + (row + 1) * _ROW}">'
                     f"{escape(text)}</text>")
    return "".join(parts) + "</svg>\n"


def svg_head(width: float, height: float) -> str:
    """Every figure's opening tag: its size, view box, font and grid style."""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" '
            f'font-size="{FONT_PX}"><style>.grid{{stroke:#e5e5e5}}</style>')
