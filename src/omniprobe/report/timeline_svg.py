"""A VRAM timeline as SVG text, from a recorded series: pure functions, standard library only.

`render_svg` draws the device's used memory and the server's own, marks the peak, and optionally
the card's capacity and when requests were sent. Same input, same bytes: the report can be
checked for staleness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from xml.sax.saxutils import escape

from omniprobe.evidence.models import TimelinePoint

_W, _H = 720, 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 28, 40


def _nice_step(span: float, ticks: int) -> float:
    raw = span / max(ticks, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)


def _ticks(top: float, count: int) -> list[float]:
    step = _nice_step(top, count)
    return [round(i * step, 6) for i in range(int(top / step + 1e-9) + 1)]


def _label(x: float, y: float, text: str, anchor: str = "start") -> str:
    """Text over a white halo, drawn as two copies so that every SVG renderer shows it."""
    at = f'x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"'
    return (f'<text {at} stroke="#fff" stroke-width="3" fill="#fff">{escape(text)}</text>'
            f"<text {at}>{escape(text)}</text>")


def _polyline(points: list[tuple[float, float]], css: str) -> str:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return f'<polyline class="{css}" fill="none" points="{coords}"/>'


def render_svg(points: Sequence[TimelinePoint], *, title: str,
               capacity_mib: float | None = None, markers: Sequence[tuple[float, str]] = (),
               note: str | None = None) -> str:
    """SVG text of the series: device memory (grey), the server's (blue), its peak (dot)."""
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
            f'viewBox="0 0 {_W} {_H}" font-family="sans-serif" font-size="11">'
            "<style>.device{stroke:#888;stroke-width:1.5}.process{stroke:#1f5fbf;"
            "stroke-width:1.5}.cap{stroke:#c0392b;stroke-dasharray:4 3}.grid{stroke:#e5e5e5}"
            ".mark{stroke:#999;stroke-dasharray:1 2}</style>"
            f'<text x="{_LEFT}" y="16" font-weight="bold">{escape(title)}</text>')
    if not points:
        message = note or "no memory samples"
        return (head + f'<text x="{_LEFT}" y="{_H / 2:.0f}">{escape(message)}</text></svg>\n')
    t_max = max(p.t_s for p in points) or 1.0
    values = [p.device_mib for p in points] + [p.process_mib or 0 for p in points]
    y_max = max([*values, capacity_mib or 0]) * 1.05 or 1.0
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(t: float) -> float:
        return _LEFT + plot_w * t / t_max

    def y(mib: float) -> float:
        return _TOP + plot_h * (1 - mib / y_max)

    parts = [head]
    for gib in _ticks(y_max / 1024, 5):
        parts.append(f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y(gib * 1024):.1f}"'
                     f' y2="{y(gib * 1024):.1f}"/><text x="{_LEFT - 6}" y="{y(gib * 1024) + 4:.1f}"'
                     f' text-anchor="end">{gib:g} GiB</text>')
    for t in _ticks(t_max, 6):
        parts.append(f'<text x="{x(t):.1f}" y="{_H - _BOTTOM + 16}" text-anchor="middle">'
                     f"{t:g} s</text>")
    for t, label in markers:
        parts.append(f'<line class="mark" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{_TOP}" '
                     f'y2="{_H - _BOTTOM}"><title>{escape(label)}</title></line>')
    if capacity_mib:
        parts.append(f'<line class="cap" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y(capacity_mib):.1f}"'
                     f' y2="{y(capacity_mib):.1f}"/>'
                     + _label(_LEFT + 4, y(capacity_mib) - 4, f"capacity {capacity_mib:,.0f} MiB"))
    parts.append(_polyline([(x(p.t_s), y(p.device_mib)) for p in points], "device"))
    owned = [p for p in points if p.process_mib is not None]
    if owned:
        parts.append(_polyline([(x(p.t_s), y(p.process_mib)) for p in owned], "process"))
    peak = max(owned, key=lambda p: p.process_mib) if owned else max(
        points, key=lambda p: p.device_mib)
    peak_mib = peak.process_mib if owned else peak.device_mib
    # The label goes right of the dot, or left of it near the right edge, and under it (clear
    # of the capacity line) rather than above.
    anchor = "end" if x(peak.t_s) > _W - 180 else "start"
    label_x = x(peak.t_s) + (-8 if anchor == "end" else 8)
    parts.append(f'<circle cx="{x(peak.t_s):.1f}" cy="{y(peak_mib):.1f}" r="3.5" fill="#c0392b"/>'
                 + _label(label_x, y(peak_mib) + 16,
                          f"peak {peak_mib:,.0f} MiB at {peak.t_s:.1f} s", anchor))
    legend = "grey: device used" + ("; blue: server processes" if owned else "")
    parts.append(f'<text x="{_LEFT}" y="{_H - 6}">{escape(legend)}'
                 + (f" — {escape(note)}" if note else "") + "</text></svg>\n")
    return "".join(parts)
