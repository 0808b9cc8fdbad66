"""A VRAM timeline as SVG text, from a recorded series: pure functions, standard library only.

`render_svg` draws the device's used memory and the server's own, marks the peak, and optionally
the card's capacity and when requests were sent, each request numbered with a legend below. Same
input, same bytes: the report can be checked for staleness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from xml.sax.saxutils import escape

from omniprobe.evidence.models.runs import TimelinePoint

_W, _PLOT_H = 720, 192
_LEFT, _RIGHT = 64, 16
_HEAD = 34  # the title and, right-aligned, the peak and the capacity: never inside the plot
_ROW = 13  # one row of request numbers, or one legend line
_CHAR = 6.5  # the width of a character at font-size 11, for laying labels out without overlap


def _nice_step(span: float, ticks: int) -> float:
    raw = span / max(ticks, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)


def _ticks(top: float, count: int) -> list[float]:
    step = _nice_step(top, count)
    return [round(i * step, 6) for i in range(int(top / step + 1e-9) + 1)]


def _label(x: float, y: float, text: str, anchor: str = "start", fill: str | None = None) -> str:
    """Text over a white halo, drawn as two copies so that every SVG renderer shows it."""
    at = f'x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"'
    colour = f' fill="{fill}"' if fill else ""
    return (f'<text {at} stroke="#fff" stroke-width="3" fill="#fff">{escape(text)}</text>'
            f"<text {at}{colour}>{escape(text)}</text>")


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
    """SVG text of the series: device memory (grey), the server's (blue), its peak (dot).

    Every label lies outside the plot, so none can overprint a trace: the peak and the capacity in
    the header, each request as a number in rows above the plot, and the numbers' legend below."""
    markers = sorted(markers)
    legend = [f"{i + 1} {label}" for i, (_, label) in enumerate(markers)]
    if not points:
        height = _HEAD + 40
        return (_head(title, height) + f'<text x="{_LEFT}" y="{_HEAD + 16}">'
                f"{escape(note or 'no memory samples')}</text></svg>\n")
    t_max = max(p.t_s for p in points) or 1.0
    values = [p.device_mib for p in points] + [p.process_mib or 0 for p in points]
    y_max = max([*values, capacity_mib or 0]) * 1.05 or 1.0
    plot_w = _W - _LEFT - _RIGHT

    def x(t: float) -> float:
        return _LEFT + plot_w * t / t_max

    numbers = [str(i + 1) for i in range(len(markers))]
    rows = marker_rows([x(t) for t, _ in markers], [len(n) * _CHAR for n in numbers])
    band = (max(rows) + 1) * _ROW if rows else 0
    top = _HEAD + band
    bottom = top + _PLOT_H
    columns = max(1, int(plot_w // (max((len(t) for t in legend), default=1) * _CHAR + 16)))
    legend_lines = -(-len(legend) // columns)
    height = bottom + 36 + legend_lines * _ROW + 6

    def y(mib: float) -> float:
        return top + _PLOT_H * (1 - mib / y_max)

    parts = [_head(title, height)]
    for gib in _ticks(y_max / 1024, 5):
        parts.append(f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y(gib * 1024):.1f}"'
                     f' y2="{y(gib * 1024):.1f}"/><text x="{_LEFT - 6}" y="{y(gib * 1024) + 4:.1f}"'
                     f' text-anchor="end">{gib:g} GiB</text>')
    for t in _ticks(t_max, 6):
        parts.append(f'<text x="{x(t):.1f}" y="{bottom + 16}" text-anchor="middle">{t:g} s</text>')
    for (t, label), number, row in zip(markers, numbers, rows, strict=True):
        parts.append(f'<line class="mark" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" '
                     f'y2="{bottom}"><title>{escape(label)}</title></line>'
                     + _label(x(t), _HEAD + (row + 1) * _ROW - 3, number, "middle", "#666"))
    if capacity_mib:
        parts.append(f'<line class="cap" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y(capacity_mib):.1f}"'
                     f' y2="{y(capacity_mib):.1f}"/>'
                     + _label(_W - _RIGHT, 30, f"capacity {capacity_mib:,.0f} MiB", "end"))
    parts.append(_polyline([(x(p.t_s), y(p.device_mib)) for p in points], "device"))
    owned = [p for p in points if p.process_mib is not None]
    if owned:
        parts.append(_polyline([(x(p.t_s), y(p.process_mib)) for p in owned], "process"))
    peak = max(owned, key=lambda p: p.process_mib) if owned else max(
        points, key=lambda p: p.device_mib)
    peak_mib = peak.process_mib if owned else peak.device_mib
    parts.append(f'<circle cx="{x(peak.t_s):.1f}" cy="{y(peak_mib):.1f}" r="3.5" fill="#c0392b"/>')
    parts.append(_label(_LEFT, 30, f"peak {peak_mib:,.0f} MiB at {peak.t_s:.1f} s"))
    key = "grey: device used" + ("; blue: server processes" if owned else "") + "; red dot: peak"
    if capacity_mib:
        key += "; dashed: capacity"
    if markers:
        key += "; dotted, numbered: requests"
    parts.append(f'<text x="{_LEFT}" y="{bottom + 32}">{escape(key)}'
                 + (f" — {escape(note)}" if note else "") + "</text>")
    column_w = plot_w / columns
    for i, text in enumerate(legend):
        row, column = divmod(i, columns)
        parts.append(f'<text x="{_LEFT + column * column_w:.1f}" y="{bottom + 32 + (row + 1) * _ROW}">'
                     f"{escape(text)}</text>")
    return "".join(parts) + "</svg>\n"


def _head(title: str, height: float) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height:.0f}" '
            f'viewBox="0 0 {_W} {height:.0f}" font-family="sans-serif" font-size="11">'
            "<style>.device{stroke:#888;stroke-width:1.5}.process{stroke:#1f5fbf;"
            "stroke-width:1.5}.cap{stroke:#c0392b;stroke-dasharray:4 3}.grid{stroke:#e5e5e5}"
            ".mark{stroke:#999;stroke-dasharray:1 2}</style>"
            f'<text x="{_LEFT}" y="16" font-weight="bold">{escape(title)}</text>')
