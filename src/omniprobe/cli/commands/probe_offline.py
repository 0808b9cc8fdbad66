"""`omniprobe probe-offline`: generate the fixtures with an offline engine per kwarg set (or
Diffusers profile)."""

from __future__ import annotations

import argparse

from omniprobe.cli.options import add_command, options_from
from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.harness.offline.session import run_offline

    return run_offline(find_project(), options_from(args), command=args.argv)


def add_parser(sub) -> None:
    # Its flags are generated from harness/common/options.py.
    add_command(sub, "probe-offline", "generate the fixtures with an offline engine per "
                "offline kwarg set of the host (Omni(...)), or per Diffusers profile on a "
                "Diffusers host; resumes the newest offline attempt of this environment", run)
