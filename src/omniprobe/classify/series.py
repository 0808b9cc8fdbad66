"""A GPU memory series and its reductions: pure functions over samples, no NVML.

The sampler (omniprobe.harness.common.sampler) writes a series as JSONL, one sample a line; the report
draws it (omniprobe.report.timeline_svg) from the decimated points these functions produce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from omniprobe.errors import InputError, Problem
from omniprobe.evidence.models.runs import TimelinePoint, TimelineSummary
from omniprobe.safe_io import json_loads, read_text


@dataclass(frozen=True)
class Sample:
    t_s: float
    device_mib: float
    process_mib: float | None


def summarise(samples: list[Sample], target_hz: float, sampler: str) -> TimelineSummary:
    """Peak, time of peak, count and the rate achieved; the server's own peak when it was seen."""
    if not samples:
        return TimelineSummary(sampler=sampler, state="sampled", target_hz=target_hz, samples=0)
    span = samples[-1].t_s - samples[0].t_s
    rate = (len(samples) - 1) / span if span > 0 else None
    device_peak = max(samples, key=lambda s: s.device_mib)
    owned = [s for s in samples if s.process_mib is not None]
    if owned:
        peak = max(owned, key=lambda s: s.process_mib)
        peak_mib, source = peak.process_mib, "process"
    else:
        peak, peak_mib, source = device_peak, device_peak.device_mib, "device"
    return TimelineSummary(
        sampler=sampler, state="sampled", target_hz=target_hz,
        rate_hz=round(rate, 2) if rate is not None else None, samples=len(samples),
        peak_mib=round(peak_mib, 1), peak_source=source, peak_t_s=round(peak.t_s, 3),
        device_peak_mib=round(device_peak.device_mib, 1))


def decimate(samples: list[Sample], buckets: int = 240) -> list[TimelinePoint]:
    """At most `buckets` points; each keeps its bucket's maxima, so no peak is lost."""
    if not samples:
        return []
    size = -(-len(samples) // buckets)
    points = []
    for start in range(0, len(samples), size):
        chunk = samples[start:start + size]
        owned = [s.process_mib for s in chunk if s.process_mib is not None]
        points.append(TimelinePoint(
            t_s=round(max(chunk, key=lambda s: s.device_mib).t_s, 3),
            device_mib=round(max(s.device_mib for s in chunk), 1),
            process_mib=round(max(owned), 1) if owned else None))
    return points


def unavailable(reason: str, hz: float) -> TimelineSummary:
    return TimelineSummary(sampler="NVML", state="unavailable", reason=reason, target_hz=hz,
                           samples=0)


def _sample(line: str) -> Sample | None:
    """A sample of one JSONL line; None unless it is an object with finite numbers."""
    try:
        row = json_loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict):
        return None
    process = row.get("process_mib")
    values = (row.get("t"), row.get("device_mib"), 0 if process is None else process)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
               for v in values):
        return None
    return Sample(t_s=row["t"], device_mib=row["device_mib"], process_mib=row.get("process_mib"))


def read_series(path: Path) -> list[Sample]:
    """The samples of a JSONL series; a torn last line (the sampler was killed) is left out, any
    other bad line is an InputError naming it."""
    lines = read_text(path).splitlines()
    samples, problems = [], []
    for number, line in enumerate(lines, start=1):
        sample = _sample(line)
        if sample is not None:
            samples.append(sample)
        elif number < len(lines) and line.strip():
            problems.append(Problem(str(path), f"line {number}", "expected a JSON object with "
                                    "finite numbers t and device_mib (and process_mib or none), "
                                    f"got {line[:60]!r}"))
    if problems:
        raise InputError(problems)
    return samples
