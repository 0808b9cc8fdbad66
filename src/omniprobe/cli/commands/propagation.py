"""`omniprobe propagation`: serve one fixture and seed with and without a deploy config; did its
knob reach the model?"""

from __future__ import annotations

import argparse

from omniprobe.cli.options import add_command, options_from
from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.harness.serve.propagation import run_propagation

    return run_propagation(find_project(), options_from(args), command=args.argv)


def add_parser(sub) -> None:
    # Its flags are generated from harness/common/options.py.
    add_command(sub, "propagation", "serve one fixture and seed with and without a deploy "
                "config; record whether its knob reached the model (a new attempt)", run)
