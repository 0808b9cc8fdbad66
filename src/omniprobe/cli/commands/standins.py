"""`omniprobe standins`: draw the stand-in reference images and check the fixtures' digests."""

from __future__ import annotations

import argparse
import sys

from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.cli.standins import draw, render, standin_problems
    from omniprobe.config.fixtures import load_fixtures

    project = find_project()
    drawn = draw(project.fixtures_file.parent, write=not args.check)
    print(render(drawn))
    found = standin_problems(load_fixtures(project.fixtures_file), drawn)
    for line in found:
        print(f"error: {line}", file=sys.stderr)
    return 1 if found else 0


def add_parser(sub) -> None:
    p = sub.add_parser("standins", help="draw the stand-in reference images under fixtures/ "
                       "(a file whose pixels are right is kept) and check the fixtures' digests")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if a file or a pinned digest differs from a fresh draw")
    p.set_defaults(func=run)
