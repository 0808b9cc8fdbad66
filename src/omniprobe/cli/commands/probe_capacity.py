"""`omniprobe probe-capacity`: on a Diffusers host, the smallest memory pool per profile and
reference count, bisected in one runner per profile, as a band."""

from __future__ import annotations

import argparse

from omniprobe.cli.options import add_command, options_from
from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.harness.offline.capacity_session import run_capacity

    return run_capacity(find_project(), options_from(args), command=args.argv)


def add_parser(sub) -> None:
    # Its flags are generated from harness/common/options.py.
    add_command(sub, "probe-capacity", "on a Diffusers host, bisect the smallest memory pool per "
                "profile and reference count in one runner per profile (a fresh one where a "
                "failure leaves the engine unrecovered), as a band (fits at or above A, fails at "
                "or below B, both seen at that count); resumes the newest capacity attempt", run)
