"""Evidence made on another machine, brought back whole: `omniprobe evidence pack` puts attempt
folders (and, within a size limit, their artifacts) in one archive with the sha256 of every file;
`unpack` checks every digest, validates every attempt, and refuses to overwrite anything, before
it moves a single folder into evidence/.

Archive layout (a gzipped tar): `manifest.json` ({"format": 1, "files": {path: sha256}}), then
`evidence/<host>/<attempt>/<file>` and `artifacts/<host>/<attempt>/...`.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from omniprobe.digests import sha256_bytes
from omniprobe.errors import InputError, Problem, Refusal
from omniprobe.evidence.files import ATTEMPT_FILE
from omniprobe.evidence.load import load_attempt

MANIFEST = "manifest.json"
FORMAT = 1
_ROOTS = ("evidence", "artifacts")


class ArchiveRefused(Refusal):
    """An unpack that would overwrite evidence, or an archive whose contents are not what it says."""


@dataclass(frozen=True)
class Packed:
    path: Path
    attempts: tuple[str, ...]
    files: int
    left_out: tuple[str, ...]  # artifacts over the size limit, by path


def _attempt_folders(evidence_dir: Path, attempts: list[str]) -> list[Path]:
    found = {p.name: p for p in evidence_dir.glob("*/*") if (p / ATTEMPT_FILE).is_file()}
    missing = [a for a in attempts if a not in found]
    if missing:
        raise ArchiveRefused(f"no attempt {', '.join(missing)} under {evidence_dir}")
    return [found[a] for a in attempts]


def pack(evidence_dir: Path, artifacts_dir: Path, attempts: list[str], out: Path, *,
         artifact_max_bytes: int = 0, artifact_suffixes: tuple[str, ...] = (".log", ".jsonl")
         ) -> Packed:
    """Pack the attempts' evidence folders, and each artifact of theirs with one of
    `artifact_suffixes` up to `artifact_max_bytes` (0: none), into `out`."""
    members: dict[str, bytes] = {}
    left_out = []
    for folder in _attempt_folders(evidence_dir, attempts):
        host = folder.parent.name
        for file in sorted(p for p in folder.iterdir() if p.is_file()):
            members[f"evidence/{host}/{folder.name}/{file.name}"] = file.read_bytes()
        art = artifacts_dir / host / folder.name
        for file in sorted(p for p in art.rglob("*") if p.is_file()) if art.is_dir() else []:
            rel = f"artifacts/{file.relative_to(artifacts_dir).as_posix()}"
            if file.suffix not in artifact_suffixes or file.name.startswith("."):
                continue
            if file.stat().st_size > artifact_max_bytes:
                left_out.append(rel)
                continue
            members[rel] = file.read_bytes()
    manifest = {"format": FORMAT, "files": {k: sha256_bytes(v) for k, v in members.items()}}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name, data in [(MANIFEST, json.dumps(manifest, indent=1).encode()),
                           *members.items()]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    return Packed(out, tuple(attempts), len(members), tuple(left_out))


def _member_path(name: str, archive: Path) -> PurePosixPath:
    path = PurePosixPath(name)
    if (path.is_absolute() or ".." in path.parts or len(path.parts) < 4
            or path.parts[0] not in _ROOTS):
        raise ArchiveRefused(f"{archive}: member {name!r} is not under evidence/<host>/<attempt>/ "
                             "or artifacts/<host>/<attempt>/")
    return path


def _read(archive: Path) -> dict[str, bytes]:
    try:
        with tarfile.open(archive, "r:gz") as tar:
            contents = {}
            for member in tar.getmembers():
                if not member.isfile():
                    raise ArchiveRefused(f"{archive}: member {member.name!r} is not a plain file")
                contents[member.name] = tar.extractfile(member).read()
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise InputError([Problem(str(archive), "", f"not a readable evidence archive: {exc}")]
                         ) from None
    return contents


def unpack(archive: Path, evidence_dir: Path, artifacts_dir: Path) -> tuple[str, ...]:
    """Check and move the archive's attempts into place; the attempt ids. Nothing is written
    unless every digest matches, every attempt validates and no target exists yet."""
    contents = _read(archive)
    try:
        manifest = json.loads(contents.pop(MANIFEST))
        listed = manifest["files"]
        assert manifest["format"] == FORMAT and isinstance(listed, dict)
    except (KeyError, ValueError, AssertionError, TypeError):
        raise InputError([Problem(str(archive), MANIFEST, f"expected {{\"format\": {FORMAT}, "
                                  "\"files\": {path: sha256}}")]) from None
    if set(listed) != set(contents):
        raise ArchiveRefused(f"{archive}: the manifest lists {sorted(set(listed) ^ set(contents))} "
                             "but the archive's files differ")
    bad = [n for n, data in contents.items() if sha256_bytes(data) != listed[n]]
    if bad:
        raise ArchiveRefused(f"{archive}: sha256 differs from the manifest for {', '.join(bad)}")
    attempts: dict[tuple[str, str, str], list[tuple[PurePosixPath, bytes]]] = {}
    for name, data in contents.items():
        path = _member_path(name, archive)
        attempts.setdefault(path.parts[:3], []).append((path, data))
    targets = {key: (evidence_dir if key[0] == "evidence" else artifacts_dir) / key[1] / key[2]
               for key in attempts}
    taken = [str(t) for t in targets.values() if t.exists()]
    if taken:
        raise ArchiveRefused("refusing to overwrite: " + ", ".join(taken))
    with tempfile.TemporaryDirectory(dir=evidence_dir.parent, prefix=".unpack-") as tmp:
        staged = {}
        for key, files in attempts.items():
            folder = Path(tmp) / "/".join(key)
            for path, data in files:
                target = Path(tmp) / path.as_posix()
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            staged[key] = folder
        problems = []
        for key, folder in staged.items():
            if key[0] == "evidence":
                # Validated where it would be loaded from: evidence/<host>/<attempt>.
                _, found = load_attempt(folder)
                problems.extend(found)
        if problems:
            raise InputError(problems)
        for key, folder in staged.items():
            targets[key].parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(folder), targets[key])
    return tuple(sorted({key[2] for key in attempts if key[0] == "evidence"}))
