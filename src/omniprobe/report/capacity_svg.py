"""The capacity curve as SVG text: minimum VRAM per reference count, one step line per flag set.

Pure and deterministic, like the timelines: same curve, same bytes. A count no swept cap served is
drawn as a cross above the largest cap tried.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from omniprobe.analysis.capacity_curve import CapacityCurve
from omniprobe.report.timeline_svg import _label, _ticks

_W, _H = 720, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 180, 28, 44
_COLOURS = ("#1f5fbf", "#c0392b", "#27ae60", "#8e44ad", "#d68910", "#555555")


def render_curve_svg(curve: CapacityCurve, *, title: str) -> str:
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
            f'viewBox="0 0 {_W} {_H}" font-family="sans-serif" font-size="11">'
            "<style>.grid{stroke:#e5e5e5}.cap{stroke:#bbb;stroke-dasharray:2 3}"
            ".line{stroke-width:2}</style>"
            f'<text x="{_LEFT}" y="16" font-weight="bold">{escape(title)}</text>')
    counts = curve.reference_counts
    largest_gib = max(curve.caps_mib) / 1024
    y_top = largest_gib * 1.15
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    x_step = plot_w / max(len(counts), 1)

    def x(count: int) -> float:
        return _LEFT + x_step * (counts.index(count) + 0.5)

    def y(gib: float) -> float:
        return _TOP + plot_h * (1 - gib / y_top)

    parts = [head]
    for tick in _ticks(y_top, 5):
        parts.append(f'<line class="grid" x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y(tick):.1f}" '
                     f'y2="{y(tick):.1f}"/>')
        parts.append(_label(_LEFT - 6, y(tick) + 4, f"{tick:g}", "end"))
    for cap in curve.caps_mib:
        parts.append(f'<line class="cap" x1="{_LEFT}" x2="{_LEFT + plot_w}" '
                     f'y1="{y(cap / 1024):.1f}" y2="{y(cap / 1024):.1f}"/>')
    for count in counts:
        parts.append(_label(x(count), _TOP + plot_h + 16, str(count), "middle"))
    parts.append(_label(_LEFT + plot_w / 2, _H - 8, "reference images", "middle"))
    parts.append(_label(14, _TOP + plot_h / 2, "GiB", "middle"))
    above = y(largest_gib * 1.08)
    for i, flag_set in enumerate(curve.flag_sets):
        colour = _COLOURS[i % len(_COLOURS)]
        served = [(c, curve.min_cap(flag_set, c)) for c in counts]
        steps = []
        for count, cap in served:
            if cap is None:
                continue
            left, right = x(count) - x_step / 2, x(count) + x_step / 2
            steps += [(left, y(cap / 1024)), (right, y(cap / 1024))]
        if steps:
            coords = " ".join(f"{px:.1f},{py:.1f}" for px, py in steps)
            parts.append(f'<polyline class="line" fill="none" stroke="{colour}" '
                         f'points="{coords}"/>')
        for count, cap in served:
            if cap is None:
                cx = x(count) + (i - len(curve.flag_sets) / 2) * 6
                parts.append(f'<text x="{cx:.1f}" y="{above + 4:.1f}" text-anchor="middle" '
                             f'fill="{colour}">×</text>')
            else:
                parts.append(f'<circle cx="{x(count):.1f}" cy="{y(cap / 1024):.1f}" r="3" '
                             f'fill="{colour}"/>')
        legend_y = _TOP + 14 + 16 * i
        parts.append(f'<line x1="{_W - _RIGHT + 12}" x2="{_W - _RIGHT + 30}" y1="{legend_y - 4}" '
                     f'y2="{legend_y - 4}" stroke="{colour}" stroke-width="2"/>')
        parts.append(_label(_W - _RIGHT + 36, legend_y, flag_set))
    parts.append(_label(_W - _RIGHT + 12, _TOP + 14 + 16 * len(curve.flag_sets) + 8,
                        f"× not served up to {largest_gib:g} GiB"))
    return "".join(parts) + "</svg>\n"
