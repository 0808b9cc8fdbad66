"""The VRAM timeline SVG: valid, deterministic, marks the peak, copes with nothing sampled."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from omniprobe.classify.series import read_series
from omniprobe.evidence.models.runs import TimelinePoint
from omniprobe.report.timeline_svg import marker_rows, render_svg

SVG = "{http://www.w3.org/2000/svg}"
POINTS = [TimelinePoint(t_s=0.0, device_mib=500, process_mib=None),
          TimelinePoint(t_s=1.0, device_mib=14848, process_mib=14336),
          TimelinePoint(t_s=2.5, device_mib=24064, process_mib=23552),
          TimelinePoint(t_s=4.0, device_mib=15360, process_mib=14848)]


def test_renders_valid_svg_with_both_series_and_the_peak():
    svg = render_svg(POINTS, title="sim cpuoff <probe-serve>", capacity_mib=24576,
                     markers=[(1.5, "sim-four seed 2301 & more")])
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    lines = {p.get("class"): p.get("points") for p in root.iter(f"{SVG}polyline")}
    assert set(lines) == {"device", "process"}
    assert len(lines["device"].split()) == 4 and len(lines["process"].split()) == 3
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "peak 23,552 MiB at 2.5 s" in texts
    assert "sim cpuoff <probe-serve>" in texts
    assert "capacity 24,576 MiB" in texts
    assert [t.text for t in root.iter(f"{SVG}title")] == ["sim-four seed 2301 & more"]


def test_same_series_same_bytes():
    assert render_svg(POINTS, title="x") == render_svg(list(POINTS), title="x")


def test_device_only_series_marks_the_device_peak():
    points = [TimelinePoint(t_s=t, device_mib=m) for t, m in [(0, 100), (1, 900), (2, 300)]]
    texts = [t.text for t in ET.fromstring(render_svg(points, title="t")).iter(f"{SVG}text")]
    assert "peak 900 MiB at 1.0 s" in texts


def test_nothing_sampled_says_why():
    svg = render_svg([], title="rtx5080 default", note="NVML: Driver Not Loaded")
    texts = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")]
    assert "NVML: Driver Not Loaded" in texts


def test_read_series_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"t": 0.0, "device_mib": 1.0, "process_mib": null}\n'
                    '{"t": 0.1, "device_mib": 2.0, "process_mib": 1.5}\n{"t": 0.2, "dev')
    samples = read_series(path)
    assert [(s.t_s, s.device_mib, s.process_mib) for s in samples] == [
        (0.0, 1.0, None), (0.1, 2.0, 1.5)]


def test_timeline_command_writes_the_svg(tmp_path):
    from omniprobe.cli import main

    series = tmp_path / "timeline.jsonl"
    series.write_text("".join(f'{{"t": {i / 10}, "device_mib": {100 * i}, "process_mib": '
                              f'{90 * i}}}\n' for i in range(30)))
    assert main(["timeline", str(series), "--title", "run"]) == 0
    svg = ET.fromstring((tmp_path / "timeline.svg").read_text())
    assert "peak 2,610 MiB at 2.9 s" in [t.text for t in svg.iter(f"{SVG}text")]


CHAR_W, TEXT_H = 6.5, 11  # font-size 11 sans-serif, generously


def text_boxes(root):
    """(x0, y0, x1, y1, text) of every text element, from its anchor and length."""
    boxes = []
    for t in root.iter(f"{SVG}text"):
        if t.get("stroke"):  # the white halo under a label
            continue
        x, y, width = float(t.get("x")), float(t.get("y")), len(t.text or "") * CHAR_W
        x0 = {"start": x, "middle": x - width / 2, "end": x - width}[t.get("text-anchor") or "start"]
        boxes.append((x0, y - TEXT_H, x0 + width, y, t.text))
    return boxes


def series_box(root):
    """The bounding box of everything the figure plots: the lines and dots of its series (a
    legend's sample dot is not plotted)."""
    xs, ys = [], []
    for group in root.iter(f"{SVG}g"):
        if group.get("data-series") is None:
            continue
        for line in group.iter(f"{SVG}polyline"):
            for pair in line.get("points").split():
                px, py = pair.split(",")
                xs.append(float(px))
                ys.append(float(py))
        for dot in group.iter(f"{SVG}circle"):
            xs.append(float(dot.get("cx")))
            ys.append(float(dot.get("cy")))
    return min(xs), min(ys), max(xs), max(ys)


def overlaps(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_no_label_of_a_timeline_overprints_its_series_or_another_label():
    # requests sent 50 ms apart: their numbers stack in rows instead of overprinting
    markers = [(0.5 + 0.05 * i, f"sim-pair seed {2301 + i}: ok") for i in range(12)]
    root = ET.fromstring(render_svg(POINTS, title="t", capacity_mib=24576, markers=markers))
    boxes, plotted = text_boxes(root), series_box(root)
    assert [b[4] for b in boxes if overlaps(b, plotted)] == []
    numbers = [b for b in boxes if (b[4] or "").isdigit() and not b[4].endswith(" s")]
    assert len(numbers) == 12
    assert [(a[4], b[4]) for i, a in enumerate(numbers) for b in numbers[i + 1:] if overlaps(a, b)] == []
    texts = [b[4] for b in boxes]
    assert "1 sim-pair seed 2301: ok" in texts and "12 sim-pair seed 2312: ok" in texts


def test_marker_rows_never_put_two_overlapping_numbers_in_one_row():
    assert marker_rows([10, 12, 40, 41, 42], [8, 8, 8, 8, 8]) == [0, 1, 0, 1, 2]


def test_no_label_of_the_capacity_figure_overprints_its_lines():
    from omniprobe.analysis.capacity_curve import CapacityCurve, CapRun, CurveStep
    from omniprobe.report.capacity_svg import render_curve_svg

    runs = (CapRun(20480, "cpuoff", "a", True, (1, 2), (1,)),
            CapRun(24576, "cpuoff", "b", True, (1, 2), (1, 2)),
            CapRun(24576, "fp8", "b", True, (1, 2), ()))
    steps = (CurveStep("cpuoff", 1, 20480, 24576), CurveStep("cpuoff", 2, 24576, 24576),
             CurveStep("fp8", 1, None, 24576), CurveStep("fp8", 2, None, 24576))
    curve = CapacityCurve("h", (20480, 24576), ("cpuoff", "fp8"), (1, 2), runs, steps)
    root = ET.fromstring(render_curve_svg(curve, title="t"))
    boxes, plotted = text_boxes(root), series_box(root)
    assert [b[4] for b in boxes if overlaps(b, plotted)] == []
    texts = [b[4] for b in boxes]
    # 2 failed at 20 GiB and fit at 24; fp8 fit at no cap it ran, 24 the largest
    assert texts.count("≤ 20") == 1 and texts.count("20–24") == 1 and texts.count("> 24") == 2
    assert "fp8: no count served" in texts  # drawn as such: no line, no legend sample
    assert len(list(root.iter(f"{SVG}polyline"))) == 1
    assert [s.get("data-legend") for s in root.iter() if s.get("data-legend")] == [
        "cpuoff", "caps tried"]
