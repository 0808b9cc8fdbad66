"""The VRAM timeline SVG: valid, deterministic, marks the peak, copes with nothing sampled."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from omniprobe.analysis.series import read_series
from omniprobe.evidence.models import TimelinePoint
from omniprobe.report.timeline_svg import render_svg

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
