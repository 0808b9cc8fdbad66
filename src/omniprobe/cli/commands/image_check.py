"""`omniprobe image-check`: the metrics and structure verdict of image files or folders."""

from __future__ import annotations

import argparse
import sys

from omniprobe.config.project import NoProject, find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.cli.image_check import find_images, measure_images, render_json, render_table
    from omniprobe.config.hosts import load_hosts
    from omniprobe.config.report_settings import StructureChecks

    try:
        hosts_file = find_project().hosts_file
    except NoProject:
        cfg, source = StructureChecks(), "built-in defaults (no hosts.toml found)"
    else:
        cfg, source = load_hosts(hosts_file).structure, f"{hosts_file} [structure]"
    paths, problems = find_images(args.paths)
    checked, unreadable = measure_images(paths, cfg)
    problems += unreadable
    if args.json:
        sys.stdout.write(render_json(checked, problems, cfg, source))
    else:
        if checked:
            print(render_table(checked))
        print(f"thresholds: {source}")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 2
    return 1 if any(c.metrics.verdict == "broken" for c in checked) else 0


def add_parser(sub) -> None:
    p = sub.add_parser("image-check", help="metrics and structure verdict of image files or "
                       "folders (exit 1: a broken image; 2: unreadable input)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="image files, or folders to search "
                   "recursively for .png/.jpg/.jpeg/.webp")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)
