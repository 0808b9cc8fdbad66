"""`omniprobe evidence pack|unpack`: evidence made on another machine, brought back whole."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.evidence import archive

    project = find_project()
    if args.evidence_command == "unpack":
        ids = archive.unpack(args.archive, project.evidence_dir, project.artifacts_dir)
        print(f"unpacked {len(ids)} attempt(s) into {project.evidence_dir}: {', '.join(ids)}")
        return 0
    attempts = list(args.attempt) + sorted(
        p.name for host in args.host for p in (project.evidence_dir / host).glob("*")
        if (p / "attempt.json").is_file())
    if not attempts:
        print("error: name attempts with --attempt or --host", file=sys.stderr)
        return 2
    packed = archive.pack(project.evidence_dir, project.artifacts_dir, attempts, args.out,
                          artifact_max_bytes=int(args.artifact_max_mib * 2**20))
    print(f"packed {len(packed.attempts)} attempt(s), {packed.files} file(s) into {packed.path}")
    for path in packed.left_out:
        print(f"left out (over {args.artifact_max_mib:g} MiB): {path}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("evidence", help="bring evidence made on another machine back whole")
    ev_sub = p.add_subparsers(dest="evidence_command", required=True)
    q = ev_sub.add_parser("pack", help="pack attempts (their evidence, and their logs and "
                          "timelines within a size limit) into one archive with every digest")
    q.add_argument("--attempt", action="append", default=[], help="an attempt id (repeatable)")
    q.add_argument("--host", action="append", default=[],
                   help="every attempt of this host (repeatable)")
    q.add_argument("--out", type=Path, required=True, help="the archive to write (.tar.gz)")
    q.add_argument("--artifact-max-mib", type=float, default=4.0,
                   help="artifacts (.log, .jsonl) larger than this stay behind (0: none travel)")
    q.set_defaults(func=run)
    q = ev_sub.add_parser("unpack", help="check an archive's digests and attempts, then move "
                          "them into evidence/ and artifacts/; refuses to overwrite anything")
    q.add_argument("archive", type=Path)
    q.set_defaults(func=run)
