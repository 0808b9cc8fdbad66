"""`omniprobe report`: render REPORT.md from the evidence (--check: only compare)."""

from __future__ import annotations

import argparse
import sys

from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.report.render import report_diff, write_report

    project = find_project()
    if args.check:
        diff = report_diff(project)
        if diff:
            sys.stderr.write(diff)
            print("REPORT.md is stale; run `nox -s report`", file=sys.stderr)
            return 1
        print("REPORT.md is fresh")
        return 0
    path = write_report(project)
    print(f"wrote {path.relative_to(project.root)}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="render REPORT.md from the evidence")
    p.add_argument("--check", action="store_true", help="exit 1 if REPORT.md differs from a fresh render")
    p.set_defaults(func=run)
