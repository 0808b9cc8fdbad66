"""`omniprobe upstream check`: hold the harness against a real vLLM-Omni source."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.upstream.contract import check_source, differences, record, recorded, render

    project = find_project()
    contract = check_source(project, args.source, args.vllm_source)
    print(render(contract))
    if args.check:
        committed = recorded(project, contract)
        if committed is None:
            print("error: no committed evidence under evidence/upstream/ for this source; "
                  "record it with --record", file=sys.stderr)
            return 1
        diffs = differences(committed.upstream, contract)
        for line in diffs:
            print(f"differs: {line}", file=sys.stderr)
        if diffs:
            print(f"{len(diffs)} result(s) differ from {committed.path}", file=sys.stderr)
            return 1
        print(f"every result equals the committed {committed.path.relative_to(project.root)}")
        return 0
    if args.record:
        folder = record(project, contract, [
            "omniprobe", "upstream", "check", "--source", args.source.name,
            *(["--vllm-source", args.vllm_source.name] if args.vllm_source else []), "--record"])
        print(f"recorded {folder.relative_to(project.root)}")
    return 1 if any(c.status == "fail" for c in contract.checks) else 0


def add_parser(sub) -> None:
    p = sub.add_parser("upstream", help="hold the harness against a real vLLM-Omni source")
    up_sub = p.add_subparsers(dest="upstream_command", required=True)
    q = up_sub.add_parser("check", help="the named contract checks and the code citations' state "
                          "in a source, read with ast (exit 1: a check fails; with --check: a "
                          "result differs from the committed evidence)")
    q.add_argument("--source", type=Path, required=True, metavar="PATH",
                   help="a vllm-omni .whl, an unpacked tree or a clone")
    q.add_argument("--vllm-source", type=Path, metavar="PATH",
                   help="a vllm .whl, tree or clone: the serve parser vLLM-Omni's starts from, "
                        "for the flags it takes from vLLM (default: the committed attempt's "
                        "reading of them, else NOT FOUND)")
    mode = q.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="exit 1 only if a result differs from the committed evidence")
    mode.add_argument("--record", action="store_true",
                      help="record the result as a new attempt under evidence/upstream/")
    q.set_defaults(func=run)
