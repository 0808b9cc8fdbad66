"""`omniprobe image-check PATH...`: the metrics and structure verdict of any images on disk."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from omniprobe.classify.imaging import IMAGE_SUFFIXES, UnreadableImage, image_metrics
from omniprobe.cli.tables import text_table
from omniprobe.config.report_settings import StructureChecks
from omniprobe.errors import Problem
from omniprobe.evidence.models.requests import ImageMetrics


@dataclass(frozen=True)
class Checked:
    path: Path
    metrics: ImageMetrics


def find_images(paths: Iterable[str | Path]) -> tuple[list[Path], list[Problem]]:
    """Files as given (whatever their suffix); folders searched recursively for png/jpg/webp."""
    found: list[Path] = []
    problems: list[Problem] = []
    for path in map(Path, paths):
        if path.is_dir():
            images = sorted(p for p in path.rglob("*")
                            if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not images:
                problems.append(Problem(str(path), "", "folder holds no .png, .jpg, .jpeg or "
                                                       ".webp images"))
            found.extend(images)
        elif path.exists():
            found.append(path)
        else:
            problems.append(Problem(str(path), "", "no such file or folder"))
    return found, problems


def measure_images(paths: Iterable[Path], cfg: StructureChecks) -> tuple[list[Checked], list[Problem]]:
    """Measure every image; an unreadable one is a problem, and the rest are still measured."""
    checked: list[Checked] = []
    problems: list[Problem] = []
    for path in paths:
        try:
            checked.append(Checked(path, image_metrics(path, cfg)))
        except UnreadableImage as exc:
            problems.extend(exc.problems)
    return checked, problems


def render_table(checked: list[Checked]) -> str:
    rows = [
        [str(c.path), m.mode, f"{m.width}x{m.height}", f"{m.opaque_fraction:.3f}",
         f"{m.alpha_mean:.1f}", f"{m.rgb_mean:.1f}", f"{m.rgb_std:.1f}", f"{m.flatness:.3f}",
         m.verdict + (f" ({'; '.join(m.reasons)})" if m.reasons else "")]
        for c in checked
        for m in [c.metrics]
    ]
    headers = ["image", "mode", "size", "opaque", "alpha mean", "rgb mean", "rgb std", "flatness",
               "verdict"]
    return text_table(headers, rows)


def render_json(checked: list[Checked], problems: list[Problem], cfg: StructureChecks,
                thresholds_from: str) -> str:
    payload = {
        "thresholds": cfg.model_dump(),
        "thresholds_from": thresholds_from,
        "images": [{"path": str(c.path), **c.metrics.model_dump()} for c in checked],
        "unreadable": [{"path": p.file, "error": p.message} for p in problems],
    }
    return json.dumps(payload, indent=2, allow_nan=False) + "\n"
