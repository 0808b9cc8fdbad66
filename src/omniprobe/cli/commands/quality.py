"""`omniprobe quality`: PSNR against a baseline attempt's images, and determinism groups."""

from __future__ import annotations

import argparse
from pathlib import Path

from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.cli.tables import psnr_summary
    from omniprobe.harness.common.quality import run_quality

    project = find_project()
    result = run_quality(project, args.baseline, attempt_id=args.attempt, layout=args.layout,
                         comparator=args.comparator, baseline_attempt=args.baseline_attempt)
    print(psnr_summary(result))
    for path in result.written:
        print(f"wrote {path}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("quality", help="PSNR of an attempt's outputs against a baseline attempt's "
                       "images, and determinism groups; writes psnr.json and determinism.json")
    p.add_argument("--baseline", type=Path, required=True, metavar="DIR",
                   help="folder of the baseline attempt's images")
    p.add_argument("--attempt", metavar="ID", help="attempt to check (default: the most recently "
                   "started one with image artifacts)")
    p.add_argument("--layout", metavar="PATTERN", help="baseline image path under DIR, e.g. "
                   "'{fixture}/{seed}.png' (default: hosts.toml [quality] baseline_layout)")
    p.add_argument("--comparator", choices=["rgba", "rgb"],
                   help="channels compared (default: hosts.toml [quality] comparator)")
    p.add_argument("--baseline-attempt", metavar="ID",
                   help="attempt id of the baseline images (default: the attempt's baseline)")
    p.set_defaults(func=run)
