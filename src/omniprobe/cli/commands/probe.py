"""`omniprobe probe-init` and `probe-serve`: start the server under each flag set and record how
init ends; serve every runnable fixture x seed per flag set."""

from __future__ import annotations

import argparse

from omniprobe.cli.options import add_command, options_from
from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.harness.serve.session import run_probe

    return run_probe(find_project(), args.command, options_from(args), command=args.argv)


def add_parser(sub) -> None:
    # Their flags are generated from harness/common/options.py.
    for name, text in (("probe-init", "start the server under each flag set; record init"),
                       ("probe-serve", "serve every runnable fixture x seed per flag set")):
        add_command(sub, name, text, run)
