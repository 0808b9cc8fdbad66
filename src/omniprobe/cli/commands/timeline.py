"""`omniprobe timeline`: render a recorded GPU memory series as SVG."""

from __future__ import annotations

import argparse
from pathlib import Path


def run(args: argparse.Namespace) -> int:
    from omniprobe.atomic import write_text_atomic
    from omniprobe.classify.series import decimate, read_series
    from omniprobe.report.timeline_svg import render_svg

    svg = render_svg(decimate(read_series(args.series)), title=args.title or args.series.name)
    out = args.output or args.series.with_suffix(".svg")
    write_text_atomic(out, svg)
    print(f"wrote {out}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("timeline", help="render a recorded GPU memory series (JSONL) as SVG")
    p.add_argument("series", type=Path)
    p.add_argument("-o", "--output", type=Path)
    p.add_argument("--title")
    p.set_defaults(func=run)
