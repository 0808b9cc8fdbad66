"""Wall time of `omniprobe upstream check` on a real source (target: under 10 s for the
registry's ~1,700-file wheel, so CI's `nox -s upstream -- --check` stays cheap).

Times, in-process and per phase: opening the source (unzip or walk), the named checks (ast reads,
only files that hold what a check looks for are parsed) and the evidence's citations.

    PYTHONPATH=src python benchmarks/bench_upstream.py PATH [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from omniprobe.config.hosts import load_hosts
from omniprobe.config.project import find_project
from omniprobe.evidence.load import load_evidence
from omniprobe.evidence.upstream import UPSTREAM_HOST
from omniprobe.upstream.anchors import citations, locate
from omniprobe.upstream.checks import run_checks
from omniprobe.upstream.source import open_source


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a vllm-omni .whl, unpacked tree or clone")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    project = find_project()
    cfg = load_hosts(project.hosts_file)
    evidence, _ = load_evidence(project.evidence_dir)
    cited = citations([a for a in evidence.attempts if a.host != UPSTREAM_HOST and not a.simulated])
    phases: dict[str, list[float]] = {"open": [], "checks": [], "citations": [], "total": []}
    for _ in range(args.runs):
        t0 = time.perf_counter()
        source = open_source(args.source)
        t1 = time.perf_counter()
        checks = run_checks(source, cfg, project.root)
        t2 = time.perf_counter()
        states = [locate(source, c) for c in cited]
        t3 = time.perf_counter()
        for name, value in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t3 - t0), strict=True):
            phases[name].append(value)
    print(f"{len(source.files)} files, {len(checks)} checks, {len(states)} citations")
    for name, times in phases.items():
        print(f"{name}: median {statistics.median(times):.3f} s, max {max(times):.3f} s "
              f"over {len(times)} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
