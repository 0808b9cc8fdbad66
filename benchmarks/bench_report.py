"""Render time of the report, and validation time of an attempt with 10,000 request records.

Targets: render under 1 s; validation of 10,000 request records under 2 s.
Run: python benchmarks/bench_report.py  (from the repository root)
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from omniprobe.config.project import Project
from omniprobe.evidence.migrations import FORMAT_VERSION
from omniprobe.evidence.validate import load_project
from omniprobe.report.render import render_report

REPO = Path(__file__).resolve().parents[1]
RECORDS = 10_000


def best_of(fn, repeat: int = 5) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def project_with_requests(root: Path) -> Project:
    for part in ("hosts.toml", "fixtures", "evidence", "templates", "schemas"):
        src = REPO / part
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, root / part)
    folder = root / "evidence" / "rtx3090" / "bench-requests"
    folder.mkdir()
    (folder / "attempt.json").write_text(json.dumps({"format_version": FORMAT_VERSION, "attempt": {
        "id": "bench-requests", "host": "rtx3090", "date": "2026-11-30", "description": "benchmark",
        "provenance": {"kind": "measured", "host": "rtx3090", "hostname": "cachyos-alexander",
                       "tool_version": "0.1.0", "command": ["bench"], "started_at": "2026-11-30T00:00:00Z"},
    }}))
    (folder / "runs.json").write_text(json.dumps({"format_version": FORMAT_VERSION, "runs": [
        {"flag_set": "cpuoff", "init": {"outcome": "ready"}}]}))
    fixtures = ["single-reference", "edit-compose-pair", "edit-compose-three", "edit-compose-four"]
    records = [{
        "flag_set": "cpuoff", "fixture": fixtures[i % 4], "seed": 2301 + i, "outcome": "ok",
        "structure": "sound", "wall_s": 30 + i % 7, "server_peak_mb": 20000.0 + i % 900,
        "output_sha256": f"{i:064x}", "pixels_sha256": f"{i + 1:064x}",
        "artifact": f"artifacts/bench/{i}.png",
    } for i in range(RECORDS)]
    (folder / "requests.json").write_text(
        json.dumps({"format_version": FORMAT_VERSION, "requests": records}))
    return Project(root)


def main() -> None:
    repo = Project(REPO)
    best, median = best_of(lambda: render_report(repo))
    print(f"render REPORT.md (load + validate + verdicts + Jinja): best {best * 1000:.1f} ms, "
          f"median {median * 1000:.1f} ms (target < 1000 ms)")
    with tempfile.TemporaryDirectory() as tmp:
        project = project_with_requests(Path(tmp))

        def validate() -> None:
            _, problems = load_project(project)
            assert not problems, problems[:3]

        best, median = best_of(validate)
        print(f"validate all evidence incl. {RECORDS:,} request records: best {best * 1000:.1f} ms, "
              f"median {median * 1000:.1f} ms (target < 2000 ms)")


if __name__ == "__main__":
    main()
