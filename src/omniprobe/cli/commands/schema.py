"""`omniprobe schema`: write the JSON Schema of every file format to schemas/ (--check: only compare)."""

from __future__ import annotations

import argparse
import sys

from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.evidence.schema import stale_schemas, write_schemas

    project = find_project()
    if args.check:
        stale = stale_schemas(project.schema_dir)
        for name in stale:
            print(f"stale: schemas/{name}", file=sys.stderr)
        return 1 if stale else 0
    for path in write_schemas(project.schema_dir):
        print(f"wrote {path.relative_to(project.root)}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("schema", help="write JSON Schema for every file format to schemas/")
    p.add_argument("--check", action="store_true", help="exit 1 if the committed schemas are stale")
    p.set_defaults(func=run)
