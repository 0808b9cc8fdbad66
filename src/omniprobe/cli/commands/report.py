"""`omniprobe report`: render REPORT.md, report/DETAILS.md, report/HARNESS.md and their figures
from the evidence (--check: only compare, naming each stale file)."""

from __future__ import annotations

import argparse
import sys

from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.report.render import stale_files, write_report

    project = find_project()
    if args.check:
        stale = stale_files(project)
        for path, summary in stale.items():
            print(f"stale: {path}: {summary}", file=sys.stderr)
        if stale:
            print(f"{len(stale)} report file(s) stale; run `nox -s report` to render them",
                  file=sys.stderr)
            return 1
        print("the report is fresh: REPORT.md, report/DETAILS.md, report/HARNESS.md and their figures")
        return 0
    written = write_report(project)
    for path in written.wrote:
        print(f"wrote {path}")
    for path in written.removed:
        print(f"removed {path} (no longer rendered)")
    print(f"report: {len(written.wrote)} file(s) written, {len(written.removed)} removed, "
          f"{written.unchanged} unchanged")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="render REPORT.md, report/DETAILS.md, report/HARNESS.md "
                                      "and their figures from the evidence")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if a committed report file differs from a fresh render, naming each")
    p.set_defaults(func=run)
