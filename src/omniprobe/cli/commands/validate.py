"""`omniprobe validate`: check hosts.toml, templates/report.toml, fixtures/, every evidence file and
the committed schemas."""

from __future__ import annotations

import argparse
import sys

from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.config.report_settings import load_report_settings
    from omniprobe.errors import InputError
    from omniprobe.evidence.schema import stale_schemas
    from omniprobe.evidence.validate import load_project

    project = find_project()
    loaded, problems = load_project(project)
    try:
        load_report_settings(project.report_settings_file)
    except InputError as exc:
        problems = [*problems, *exc.problems]
    stale = stale_schemas(project.schema_dir)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    for name in stale:
        print(f"error: schemas/{name} is stale; run `omniprobe schema`", file=sys.stderr)
    if problems or stale:
        print(f"{len(problems) + len(stale)} problem(s) found", file=sys.stderr)
        return 1
    assert loaded is not None
    models = sum(1 for h in loaded.hosts.hosts.values() if h.capacity and h.emulation is None)
    print(f"valid: hosts.toml ({len(loaded.hosts.hosts)} hosts), sim.toml ({models} capacity "
          f"model{'s' * (models != 1)}), templates/report.toml, "
          f"{len(loaded.fixtures.fixtures)} fixtures, {len(loaded.evidence.attempts)} attempts")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="check hosts.toml, sim.toml, templates/report.toml, fixtures/, "
                       "evidence/ and schemas/")
    p.set_defaults(func=run)
