"""`omniprobe propagation`: serve one fixture and seed with and without a deploy config; did its
knob reach the model?"""

from __future__ import annotations

import argparse

from omniprobe.cli.options import add_options, options_from
from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.harness.propagation import run_propagation

    return run_propagation(find_project(), options_from(args), command=args.argv)


def add_parser(sub) -> None:
    p = sub.add_parser("propagation", help="serve one fixture and seed with and without a deploy "
                       "config; record whether its knob reached the model (a new attempt)")
    add_options(p, "propagation")  # generated from harness/options.py
    p.set_defaults(func=run)
