"""Evidence made on another machine, brought back whole: `omniprobe evidence pack` puts attempt
folders (and, within a size limit, their logs and timelines) in one archive with the sha256 of
every file; `unpack` checks every digest, validates the attempts together with the evidence
already here (validate's own cross-checks), refuses to overwrite anything, then moves them into
place as one journalled transaction (`unpack_journal.py`).

Pack reads only regular files of the attempts' own folders (no symlink is followed), validates
what it packs, redacts the secrets of its environment by value, and never writes inside
evidence/. The layout and the limits are `archive_read.py`'s.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

from omniprobe.atomic import write_bytes_atomic
from omniprobe.config.project import Project
from omniprobe.digests import sha256_bytes
from omniprobe.errors import InputError, Problem
from omniprobe.evidence import unpack_journal
from omniprobe.evidence.archive_read import (
    ARTIFACT_SUFFIXES,
    ARTIFACTS,
    EVIDENCE,
    LIMITS,
    MANIFEST,
    MIB,
    ArchiveLimits,
    ArchiveRefused,
    member_path,
    read_manifest,
    read_members,
)
from omniprobe.evidence.files import ATTEMPT_FILE
from omniprobe.evidence.models.archive import ARCHIVE_FORMAT, ArchiveManifest
from omniprobe.evidence.validate import load_project
from omniprobe.redaction import redact_bytes, secret_values
from omniprobe.safe_io import confine

__all__ = ["ArchiveRefused", "Packed", "Unpacked", "pack", "recover", "unpack"]


@dataclass(frozen=True)
class Packed:
    path: Path
    attempts: tuple[str, ...]
    files: int
    left_out: tuple[str, ...]  # artifacts that stay behind, each with why


@dataclass(frozen=True)
class Unpacked:
    attempts: tuple[str, ...]  # taken
    recovered: tuple[str, ...]  # what was done of an unpack an interrupt left
    skipped: tuple[str, ...] = ()  # byte-identical to the attempt already here
    extended: tuple[str, ...] = ()  # here already; the archive added records to it


def _attempt_folders(evidence_dir: Path, attempts: list[str]) -> list[Path]:
    """Each named attempt's folder: real folders only, a symlinked host or attempt is no evidence."""
    found = {}
    for host in sorted(p for p in evidence_dir.iterdir() if p.is_dir() and not p.is_symlink()):
        for folder in sorted(p for p in host.iterdir() if p.is_dir() and not p.is_symlink()):
            if (folder / ATTEMPT_FILE).is_file():
                found.setdefault(folder.name, folder)
    missing = [a for a in attempts if a not in found]
    if missing:
        raise ArchiveRefused(f"no attempt {', '.join(missing)} under {evidence_dir}")
    return [found[a] for a in dict.fromkeys(attempts)]


def _regular_bytes(path: Path, max_bytes: int) -> bytes | str:
    """A regular file's bytes, opened without following a symlink; else why it is not read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return "a symlink, not followed" if path.is_symlink() else f"cannot read: {exc.strerror}"
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:  # fdopen refuses a folder
        os.close(fd)
        return "not a regular file" if not stat.S_ISREG(info.st_mode) else \
            f"over {max_bytes / MIB:g} MiB"
    with os.fdopen(fd, "rb") as handle:
        return handle.read(max_bytes + 1)


def _artifact_files(folder: Path) -> list[Path]:
    """Every entry under an attempt's artifacts folder, without descending into a symlink."""
    if folder.is_symlink() or not folder.is_dir():
        return [folder] if folder.is_symlink() else []
    found = []
    for parent, dirs, files in os.walk(folder, followlinks=False):
        found += [Path(parent, d) for d in dirs if Path(parent, d).is_symlink()]
        found += [Path(parent, f) for f in files]
    return sorted(found)


def _pack_problems(project: Project, folders: list[Path]) -> list[Problem]:
    """validate's problems of the attempts to pack (a broken one elsewhere is not theirs)."""
    _, problems = load_project(project)
    return [p for p in problems if any(Path(p.file).is_relative_to(f) for f in folders)]


def _check_out(out: Path, project: Project) -> None:
    where = out.resolve()
    for root in (project.evidence_dir, project.root / unpack_journal.STAGING):
        if where.is_relative_to(root.resolve()):
            raise InputError([Problem(str(out), "--out", f"inside {root}: the archive is written "
                                      "elsewhere, never over or beside the evidence")])
    if out.is_symlink() or (out.exists() and not out.is_file()):
        raise InputError([Problem(str(out), "--out", "expected a new file or a regular file to "
                                  "replace, not a folder, symlink, FIFO or device")])


def pack(project: Project, attempts: list[str], out: Path, *, artifact_max_bytes: int = 0,
         limits: ArchiveLimits = LIMITS) -> Packed:
    """Pack the attempts' evidence folders, and each artifact of theirs (a log or timeline) up to
    `artifact_max_bytes` (0: none), into `out`, once the attempts validate."""
    _check_out(out, project)
    folders = _attempt_folders(project.evidence_dir, attempts)
    problems = _pack_problems(project, folders)
    if problems:
        raise InputError(problems)
    secrets = secret_values()
    members: dict[str, bytes] = {}
    left_out: list[str] = []
    for folder in folders:
        host = folder.parent.name
        for file in sorted(folder.iterdir()):
            data = _regular_bytes(file, limits.member_bytes)
            if isinstance(data, str):
                raise InputError([Problem(str(file), "", f"{data}; an evidence file is a regular "
                                          "file of its attempt's folder")])
            members[f"{EVIDENCE}/{host}/{folder.name}/{file.name}"] = redact_bytes(data, secrets)
        art = project.artifacts_dir / host / folder.name
        for file in _artifact_files(art):
            rel = f"{ARTIFACTS}/{file.relative_to(project.artifacts_dir).as_posix()}"
            hidden = any(part.startswith(".") for part in file.relative_to(art).parts)
            if hidden or not file.name.endswith(ARTIFACT_SUFFIXES):
                continue  # images stay behind; a temp file is a write in flight
            data = _regular_bytes(file, min(artifact_max_bytes, limits.member_bytes))
            if isinstance(data, str):
                left_out.append(f"{rel} ({data})")
                continue
            members[rel] = redact_bytes(data, secrets)
    _within(members, limits, out)
    manifest = ArchiveManifest(format=ARCHIVE_FORMAT,
                               files={k: sha256_bytes(v) for k, v in members.items()})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in [(MANIFEST, manifest.model_dump_json(indent=1).encode()),
                           *members.items()]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    write_bytes_atomic(out, buffer.getvalue())
    return Packed(out, tuple(f.name for f in folders), len(members), tuple(left_out))


def _within(members: dict[str, bytes], limits: ArchiveLimits, out: Path) -> None:
    """Pack writes nothing unpack would refuse for its size."""
    total = sum(len(v) for v in members.values())
    if len(members) + 1 > limits.members or total > limits.unpacked_bytes:
        raise InputError([Problem(str(out), "", f"{len(members) + 1} files of {total} bytes: over "
                                  f"the limits of {limits.members} files and "
                                  f"{limits.unpacked_bytes // MIB} MiB an unpack takes; pack "
                                  "fewer attempts at a time")])


def recover(project: Project) -> tuple[str, ...]:
    """Complete or roll back an unpack an interrupt left; what was done."""
    with unpack_journal.locked(project):
        return tuple(unpack_journal.recover(project))


def unpack(archive: Path, project: Project, limits: ArchiveLimits = LIMITS) -> Unpacked:
    """Check the archive, stage it, validate it with the evidence here, and move it into place.
    Nothing lands unless every digest matches, every attempt validates with validate's
    cross-checks, every artifact belongs to an attempt the archive carries, and no target exists."""
    contents = read_members(archive, limits)
    listed = read_manifest(archive, contents)
    if set(listed) != set(contents):
        raise ArchiveRefused(f"{archive}: the manifest lists {sorted(set(listed) ^ set(contents))} "
                             "but the archive's files differ")
    bad = [n for n, data in contents.items() if sha256_bytes(data) != listed[n]]
    if bad:
        raise ArchiveRefused(f"{archive}: sha256 differs from the manifest for {', '.join(bad)}")
    paths = {name: member_path(name, archive) for name in contents}
    carried = sorted({p.attempt_key for p in paths.values() if p.root == EVIDENCE})
    if not carried:
        raise ArchiveRefused(f"{archive}: holds no attempt's evidence; an archive of artifacts "
                             "alone is refused")
    strays = sorted({n for n, p in paths.items() if p.root == ARTIFACTS
                     and p.attempt_key not in carried})
    if strays:
        raise ArchiveRefused(f"{archive}: artifacts of attempts the archive does not carry: "
                             + ", ".join(strays))
    with unpack_journal.locked(project):
        recovered = tuple(unpack_journal.recover(project))
        moves = _targets(archive, project, carried)
        same, extended = compare_attempts(project, carried, contents, paths, archive)
        staging = unpack_journal.new_staging(project)
        try:
            for key in extended:  # its artifacts here stay, beside the archive's new ones
                here = moves[key][1]
                if here.is_dir():
                    shutil.copytree(here, staging.artifacts.joinpath(*key), symlinks=True)
            for name, data in contents.items():
                path = paths[name]
                if path.attempt_key in same and (path.root == EVIDENCE
                                                 or moves[path.attempt_key][1].exists()):
                    continue  # already here as it is
                base = staging.evidence if path.root == EVIDENCE else staging.artifacts
                target = base.joinpath(path.host, path.attempt, *path.rest)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            problems = _staged_problems(project, staging.evidence, archive, frozenset(extended))
            if problems:
                raise InputError(problems)
        except BaseException:
            unpack_journal.discard(staging)
            raise
        unpack_journal.commit(staging, [
            (staged, target, unpack_journal.replaced_path(staging, staged)
             if key in extended and target.exists() else None)
            for key, pair in moves.items()
            for root, target in zip((staging.evidence, staging.artifacts), pair, strict=True)
            if (staged := root.joinpath(*key)).is_dir()])
    return Unpacked(tuple(key[1] for key in carried if key not in same | extended), recovered,
                    tuple(key[1] for key in carried if key in same),
                    tuple(key[1] for key in carried if key in extended))


def _targets(archive: Path, project: Project, carried: list[tuple[str, str]]
             ) -> dict[tuple[str, str], tuple[Path, Path]]:
    """Each attempt's evidence and artifacts folders here, confined. An attempt whose evidence
    is here is compared by identical_attempts; artifacts here without their evidence are
    refused."""
    targets = {key: tuple(confine(root, f"{key[0]}/{key[1]}", file=archive, field=key[1])
                          for root in (project.evidence_dir, project.artifacts_dir))
               for key in carried}
    taken = [str(artifacts) for evidence, artifacts in targets.values()
             if not evidence.exists() and (artifacts.exists() or artifacts.is_symlink())]
    taken += [str(evidence) for evidence, _ in targets.values()
              if evidence.is_symlink() or (evidence.exists() and not evidence.is_dir())]
    if taken:
        raise ArchiveRefused("refusing to overwrite: " + ", ".join(taken))
    return targets


def evidence_differences(here: dict[str, bytes], carried: dict[str, bytes]) -> list[str]:
    """The files of one attempt that differ between here and the archive, each with how."""
    return ([f"{n} (content differs)" for n in sorted(here.keys() & carried.keys())
             if here[n] != carried[n]]
            + [f"{n} (only here)" for n in sorted(here.keys() - carried.keys())]
            + [f"{n} (only in the archive)" for n in sorted(carried.keys() - here.keys())])


def only_adds(here, carried) -> bool:
    """The rule for a resumed attempt: `carried` holds everything `here` does, with records
    added and nothing changed. Objects keep their keys, each value by this rule (a key new in
    carried holds a list: records listed for the first time); a list keeps every element of
    here's, equal and in order, with new ones anywhere; anything else is equal."""
    if isinstance(here, dict) and isinstance(carried, dict):
        return here.keys() <= carried.keys() and all(
            isinstance(carried[k], list) for k in carried.keys() - here.keys()) and all(
            only_adds(here[k], carried[k]) for k in here)
    if isinstance(here, list) and isinstance(carried, list):
        found = iter(carried)
        return all(any(item == other for other in found) for item in here)
    return here == carried


# The files whose rows summarise what they list, re-summarised as a resume adds to it: a row is
# known by its identity, what it summarises may only grow (its lifetimes, its logs and
# timelines; a search's bands, each committed band as it was), what it ran under stays as it was
# (a search's profile settings and grid), and its other fields follow from them, which validate
# holds to the records.
SUMMARIES = {"runs.json": (("flag_set",), ("lifetimes",), ()),
             "offline.json": (("kwarg_set", "profile"), ("lifetimes",), ()),
             "capacity.json": (("profile",), ("bands", "logs", "timelines", "host_ram",
                                              "restarts", "timed"),
                               ("settings", "search", "num_inference_steps", "true_cfg_scale",
                                "seed", "sizes"))}


def summary_only_adds(name: str, here, carried) -> bool:
    """A summary file's rule: every row here is still there (by identity), what it summarises
    kept with additions, what it ran under unchanged; rows may be new."""
    identity, grown, fixed = SUMMARIES[name]
    if not (isinstance(here, dict) and isinstance(carried, dict)
            and here.keys() == carried.keys()):
        return False
    for key, rows in here.items():
        if not isinstance(rows, list):
            if rows != carried[key]:
                return False
            continue
        if not isinstance(carried[key], list):
            return False
        key_of = lambda row: tuple(row.get(k) for k in identity)  # noqa: E731
        theirs = {key_of(r): r for r in carried[key] if isinstance(r, dict)}
        for row in rows:
            other = theirs.get(key_of(row)) if isinstance(row, dict) else None
            if other is None or not all(only_adds(row.get(g, []), other.get(g, []))
                                        for g in grown):
                return False
            if any(row.get(f) != other.get(f) for f in fixed):
                return False
    return True


def file_change(name: str, here: bytes | None, carried: bytes) -> str | None:
    """How the archive's copy of an attempt's file stands to the one here: None, the same bytes;
    "same records", other bytes of the same JSON; "adds", records added and none changed (a
    resume made elsewhere); else why it is refused."""
    if here == carried:
        return None
    try:
        mine, theirs = json.loads(here), json.loads(carried)
    except (TypeError, ValueError):  # a symlink here, or not JSON (a log): bytes must match
        return "content differs: a record changed or went"
    if mine == theirs:
        return "same records"
    adds = summary_only_adds(name, mine, theirs) if name in SUMMARIES else only_adds(mine, theirs)
    return "adds" if adds else "content differs: a record changed or went"


def compare_attempts(project: Project, carried: list[tuple[str, str]],
                     contents: dict[str, bytes], paths: dict, archive: Path
                     ) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """Of the carried attempts already here: those here byte for byte (their evidence; artifacts
    are taken where none are here), and those the archive only adds records to (a resume made
    elsewhere); ArchiveRefused naming every differing file of any other one here."""
    same, extended, refused = set(), set(), []
    for key in carried:
        folder = project.evidence_dir.joinpath(*key)
        if not folder.is_dir():
            continue
        here = {f.relative_to(folder).as_posix(): _here_bytes(f)
                for f in sorted(folder.rglob("*")) if f.is_file() or f.is_symlink()}
        ours = {"/".join(paths[n].rest): data for n, data in contents.items()
                if paths[n].root == EVIDENCE and paths[n].attempt_key == key}
        if not evidence_differences(here, ours):
            same.add(key)
            continue
        changes = {n: file_change(n, here[n], ours[n]) for n in sorted(here.keys() & ours.keys())}
        differ = ([f"{n} (only here)" for n in sorted(here.keys() - ours.keys())]
                  + [f"{n} ({why})" for n, why in changes.items()
                     if why not in (None, "same records", "adds")]
                  + _artifact_conflicts(project, key, contents, paths))
        if not differ and "adds" not in changes.values() and not ours.keys() - here.keys():
            differ = evidence_differences(here, ours)  # other bytes, the same records: no resume
        if differ:
            refused.append(f"{folder}: {', '.join(differ)}")
        else:
            extended.add(key)
    if refused:
        raise ArchiveRefused(f"{archive}: refusing to overwrite committed content that differs: "
                             + "; ".join(refused))
    return same, extended


def _artifact_conflicts(project: Project, key: tuple[str, str], contents: dict[str, bytes],
                        paths: dict) -> list[str]:
    """Artifacts the archive carries for an attempt here that differ from the same files here."""
    folder = project.artifacts_dir.joinpath(*key)
    out = []
    for name, data in contents.items():
        path = paths[name]
        if path.root == ARTIFACTS and path.attempt_key == key:
            mine = folder.joinpath(*path.rest)
            if (mine.exists() or mine.is_symlink()) and _here_bytes(mine) != data:
                out.append(f"artifacts/{key[0]}/{key[1]}/{'/'.join(path.rest)} (differs)")
    return out


def _here_bytes(path: Path) -> bytes | None:
    """A file's bytes here; None for a symlink, which no archive member equals."""
    return None if path.is_symlink() else path.read_bytes()


def _staged_problems(project: Project, staged: Path, archive: Path,
                     superseded: frozenset[tuple[str, str]] = frozenset()) -> list[Problem]:
    """What validate finds with the staged tree in place that it does not find without it: the
    archive's own problems, each named by its member, and any it makes of the evidence here (a
    broken file already here is not the archive's to fix)."""
    _, before = load_project(project)
    _, after = load_project(project, staged=staged, superseded=superseded)
    out, known = [], set(before)
    for p in after:
        if Path(p.file).is_relative_to(staged):
            member = f"{EVIDENCE}/{Path(p.file).relative_to(staged).as_posix()}"
            out.append(Problem(f"{archive} ({member})", p.path, p.message))
        elif p not in known:
            out.append(p)
    return out
