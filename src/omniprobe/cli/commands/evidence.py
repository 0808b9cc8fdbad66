"""`omniprobe evidence pack|unpack|upgrade`: evidence made on another machine, brought back whole;
evidence of an older format version, rewritten as the current one."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omniprobe.cli.options import parser_of
from omniprobe.config.project import find_project
from omniprobe.harness.common.options import Bounds
from omniprobe.limits import ARCHIVE_LIMITS as LIMITS

# Logs and timelines travel up to this size each: an archive member's limit.
ARTIFACT_MIB = Bounds("mebibytes", float, 0, LIMITS.member_bytes / 2**20,
                      f"a size in MiB from 0 to {LIMITS.member_bytes / 2**20:g}")


def run(args: argparse.Namespace) -> int:
    from omniprobe.evidence import archive

    project = find_project()
    if args.evidence_command == "unpack":
        unpacked = archive.unpack(args.archive, project)  # completes an interrupted one first
        for line in unpacked.recovered:
            print(line)
        print(f"unpacked {len(unpacked.attempts)} attempt(s) into {project.evidence_dir}: "
              f"{', '.join(unpacked.attempts) or 'none'}")
        if unpacked.skipped:
            print(f"skipped {len(unpacked.skipped)} attempt(s) already here byte for byte: "
                  f"{', '.join(unpacked.skipped)}")
        if unpacked.extended:
            print(f"added records to {len(unpacked.extended)} attempt(s) already here (a "
                  f"resume made elsewhere; every record here kept): "
                  f"{', '.join(unpacked.extended)}")
        return 0
    for line in archive.recover(project):  # an interrupted unpack, completed or rolled back
        print(line)
    if args.evidence_command == "upgrade":
        return _upgrade(project.evidence_dir, check=args.check)
    attempts = list(args.attempt) + sorted(
        p.name for host in args.host for p in (project.evidence_dir / host).glob("*")
        if (p / "attempt.json").is_file())
    if args.new:
        from omniprobe.evidence.uncommitted import uncommitted_attempts

        new = {attempt for _, attempt in uncommitted_attempts(project.root, project.evidence_dir)}
        committed = [a for a in attempts if a not in new]
        attempts = [a for a in attempts if a in new]
        if committed:
            print(f"left out {len(committed)} attempt(s) git already has: {', '.join(committed)}")
        if not attempts:
            print("nothing to pack: git has every attempt named")
            return 0
    if not attempts:
        print("error: name attempts with --attempt or --host", file=sys.stderr)
        return 2
    packed = archive.pack(project, attempts, args.out,
                          artifact_max_bytes=int(args.artifact_max_mib * 2**20))
    print(f"packed {len(packed.attempts)} attempt(s), {packed.files} file(s) into {packed.path}")
    for path in packed.left_out:
        print(f"left out: {path}")
    return 0


def _upgrade(evidence_dir: Path, *, check: bool) -> int:
    from omniprobe.evidence.migrations import FORMAT_VERSION
    from omniprobe.evidence.upgrade import older_files, upgrade_evidence

    older = older_files(evidence_dir) if check else upgrade_evidence(evidence_dir)
    for path, version in older:
        print(f"{path}: format version {version}" + ("" if check else f" -> {FORMAT_VERSION}"))
    if check and older:
        print(f"error: {len(older)} file(s) older than format version {FORMAT_VERSION}; run "
              "`omniprobe evidence upgrade`", file=sys.stderr)
        return 1
    print(f"{'checked' if check else 'upgraded'}: every evidence file under {evidence_dir} is at "
          f"format version {FORMAT_VERSION}" + (f" ({len(older)} rewritten)" if older else ""))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("evidence", help="bring evidence made on another machine back whole")
    ev_sub = p.add_subparsers(dest="evidence_command", required=True)
    q = ev_sub.add_parser("pack", help="pack attempts (their evidence, and their logs and "
                          "timelines within a size limit) into one archive with every digest")
    q.add_argument("--attempt", action="append", default=[], help="an attempt id (repeatable)")
    q.add_argument("--host", action="append", default=[],
                   help="every attempt of this host (repeatable)")
    q.add_argument("--new", action="store_true",
                   help="only the attempts git does not have yet (untracked, modified or staged "
                        "under evidence/): a clone's pack carries what this machine made")
    q.add_argument("--out", type=Path, required=True, help="the archive to write (.tar.gz)")
    q.add_argument("--artifact-max-mib", type=parser_of(ARTIFACT_MIB), default=4.0,
                   help="artifacts (.log, .jsonl) larger than this stay behind (0: none travel)")
    q.set_defaults(func=run)
    q = ev_sub.add_parser("unpack", help="check an archive's digests and attempts, then move "
                          "them into evidence/ and artifacts/; refuses to overwrite anything")
    q.add_argument("archive", type=Path)
    q.set_defaults(func=run)
    q = ev_sub.add_parser("upgrade", help="rewrite evidence files of an older format version as "
                          "the current one, after validating all of them; nothing else changes")
    q.add_argument("--check", action="store_true",
                   help="only list the older files, and exit 1 if there are any")
    q.set_defaults(func=run)
