"""Which attempts git does not have yet (`evidence pack --new`): an attempt with a file under
evidence/ that is untracked, modified or staged but not committed. Read from `git status`, so a
GPU machine that works from a clone packs only what it made."""

from __future__ import annotations

import subprocess
from pathlib import Path

from omniprobe.errors import Refusal


class NotAGitClone(Refusal):
    """`--new` asks git what is committed; here git cannot say."""


def status_paths(porcelain_z: bytes) -> list[str]:
    """The paths of `git status --porcelain=v1 -z` output (a rename's new path, not its old)."""
    fields, paths, i = porcelain_z.split(b"\0"), [], 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        paths.append(entry[3:].decode("utf-8", "surrogateescape"))
        if entry[:1] in (b"R", b"C"):
            i += 1  # the old path of a rename or copy follows
    return paths


def attempts_of(paths: list[str], top: Path, evidence_dir: Path) -> set[tuple[str, str]]:
    """(host, attempt) of every path inside evidence/<host>/<attempt>/."""
    found = set()
    for path in paths:
        try:
            parts = (top / path).resolve().relative_to(evidence_dir.resolve()).parts
        except ValueError:
            continue
        if len(parts) >= 3:
            found.add((parts[0], parts[1]))
    return found


def _git(root: Path, *args: str) -> bytes:
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, check=False)
    except OSError as exc:
        raise NotAGitClone(f"evidence pack --new: git cannot run here ({exc}); name attempts "
                           "with --attempt instead") from None
    if done.returncode != 0:
        raise NotAGitClone(f"evidence pack --new: {root} is not a git clone git can read "
                           f"({done.stderr.decode(errors='replace').strip()}); name attempts "
                           "with --attempt instead")
    return done.stdout


def uncommitted_attempts(root: Path, evidence_dir: Path) -> set[tuple[str, str]]:
    top = Path(_git(root, "rev-parse", "--show-toplevel").decode().strip())
    status = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--",
                  str(evidence_dir))
    return attempts_of(status_paths(status), top, evidence_dir)
