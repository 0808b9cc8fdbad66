"""`omniprobe wheels`: download (or check) a pinned wheel list for a machine that reaches no registry."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def run(args: argparse.Namespace) -> int:
    from omniprobe.env.wheels import download, read_pins, wheel_folder_problems

    if args.check:
        problems = wheel_folder_problems(read_pins(args.list), args.dest)
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        print(f"{args.dest}: " + ("differs from the list" if problems else
                                  f"every wheel of {args.list} is there, each hash right"))
        return 1 if problems else 0
    pins = download(args.list, args.dest)
    print(f"downloaded {len(pins)} wheel(s) of {args.list} into {args.dest}, each hash checked")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("wheels", help="download a pinned wheel list (wheels/h200.txt) for a "
                       "machine that reaches no registry, every hash checked")
    p.add_argument("--list", type=Path, default=Path("wheels/h200.txt"), help="the wheel list")
    p.add_argument("--dest", type=Path, default=Path(".whl"), help="the folder to fill")
    p.add_argument("--check", action="store_true",
                   help="download nothing; check the folder against the list")
    p.set_defaults(func=run)
