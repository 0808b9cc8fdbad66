"""`omniprobe nox-args`: the noxfile's router, the share of the arguments after `--` a session takes."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    import json

    from omniprobe.cli.nox_args import route_options

    posargs = args.posargs[1:] if args.posargs[:1] == ["--"] else args.posargs
    print(json.dumps(route_options(args.parser, args.session, args.run.split(","), posargs)))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("nox-args", help="the noxfile's router: which of the arguments after "
                       "`nox ... --` SESSION takes, as a JSON list (cli/nox_args.py): "
                       "omniprobe nox-args --run S1,S2 SESSION -- ARGS")
    p.add_argument("session", help="the nox session asking")
    p.add_argument("--run", required=True, help="the sessions of the nox run, comma-separated")
    p.add_argument("posargs", nargs=argparse.REMAINDER, help="the arguments after `--`")
    p.set_defaults(func=run)
