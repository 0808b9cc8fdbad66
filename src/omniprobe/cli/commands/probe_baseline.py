"""`omniprobe probe-baseline`: re-seal the seed's Diffusers baseline in its own Diffusers env."""

from __future__ import annotations

import argparse
import sys

from omniprobe.cli.options import add_command, options_from
from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.harness.offline.baseline import run_baseline

    return run_baseline(find_project(), options_from(args), command=args.argv, out=sys.stderr)


def add_parser(sub) -> None:
    # Its flags are generated from harness/common/options.py.
    add_command(sub, "probe-baseline", "re-seal the seed's Diffusers baseline: probe-offline "
                "under the host's baseline profile (default seed-baseline), its images "
                "laid out where `quality --baseline DIR` reads them", run)
