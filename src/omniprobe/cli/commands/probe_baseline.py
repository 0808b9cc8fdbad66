"""`omniprobe probe-baseline`: re-seal the seed's Diffusers baseline in its own baseline env."""

from __future__ import annotations

import argparse
import sys

from omniprobe.cli.options import add_options, options_from
from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.harness.baseline import run_baseline

    return run_baseline(find_project(), options_from(args), command=args.argv, out=sys.stderr,
                        build_env=args.build_env)


def add_parser(sub) -> None:
    p = sub.add_parser("probe-baseline", help="re-seal the seed's Diffusers baseline: "
                       "probe-offline under the host's baseline profile (default seed-baseline), "
                       "its images laid out where `quality --baseline DIR` reads them")
    add_options(p, "probe-baseline")  # generated from harness/options.py
    p.set_defaults(func=run)
    p.add_argument("--build-env", action="store_true",
                   help="first build (or, when nothing changed, only verify) the host's baseline "
                        "env, where its runner runs in one (`env build --env baseline`); without "
                        "it, a baseline env not built is refused")
