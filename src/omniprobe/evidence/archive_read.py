"""Reading an evidence archive within bounds: only regular files, every size and count limited
before the bytes are held, the manifest parsed with the loaders' nesting limit and checked by its
model, each member's path one that `pack` writes. Nothing here writes a file.

Archive layout (a gzipped tar): `manifest.json`, then `evidence/<host>/<attempt>/<file>` and
`artifacts/<host>/<attempt>/.../<file>`.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pydantic import ValidationError

from omniprobe.errors import InputError, Problem, Refusal, problems_from_validation
from omniprobe.evidence.files import ATTEMPT_FILE, SECTION_FILES
from omniprobe.evidence.models.archive import ArchiveManifest
from omniprobe.limits import ARCHIVE_LIMITS as LIMITS
from omniprobe.limits import MIB, ArchiveLimits
from omniprobe.safe_io import parse_json

MANIFEST = "manifest.json"
EVIDENCE, ARTIFACTS = "evidence", "artifacts"
# What pack lets travel of an attempt's artifacts: its logs and timelines, never its images.
ARTIFACT_SUFFIXES = (".log", ".jsonl")


class ArchiveRefused(Refusal):
    """An unpack that would overwrite evidence, or an archive whose contents are not what it says."""


def _refused(archive: Path, message: str) -> ArchiveRefused:
    return ArchiveRefused(f"{archive}: {message}")


class _Counted(io.RawIOBase):
    """The decompressed stream, refused once it passes `limit` bytes: a gzip bomb stops at the
    limit, whatever its tar headers claim."""

    def __init__(self, source, archive: Path, limit: int, what: str):
        self._source, self._archive, self._limit, self._what = source, archive, limit, what
        self._read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._source.read(len(buffer))
        self._read += len(data)
        if self._read > self._limit:
            raise _refused(self._archive, f"unpacks to more than {self._what}")
        buffer[:len(data)] = data
        return len(data)


def _open_regular(archive: Path, limits: ArchiveLimits):
    """The archive opened for reading: a regular file (a FIFO or device is refused before it can
    block), within the archive size limit."""
    try:
        fd = os.open(archive, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise InputError([Problem(str(archive), "", "file not found")]) from None
    except OSError as exc:
        raise InputError([Problem(str(archive), "", f"cannot read: {exc.strerror}")]) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise InputError([Problem(str(archive), "", "is not a regular file (a folder, FIFO, "
                                  "socket or device); expected an evidence archive (.tar.gz)")])
    if info.st_size > limits.archive_bytes:
        os.close(fd)
        raise _refused(archive, f"{info.st_size} bytes, over the limit of "
                       f"{limits.archive_bytes // MIB} MiB (archive_bytes)")
    return os.fdopen(fd, "rb")


def read_members(archive: Path, limits: ArchiveLimits = LIMITS) -> dict[str, bytes]:
    """Every member's bytes by name. Refused: a member that is not a regular file (a link, a
    folder, a device, a sparse file), a name given twice, and anything over a limit."""
    contents: dict[str, bytes] = {}
    total = 0
    with _open_regular(archive, limits) as raw:
        try:
            # The tar stream holds headers and padding besides the members: a block or two each.
            stream = io.BufferedReader(_Counted(
                gzip.GzipFile(fileobj=raw), archive,
                limits.unpacked_bytes + 1024 * limits.members + 2 * tarfile.RECORDSIZE,
                f"the limit of {limits.unpacked_bytes // MIB} MiB (unpacked_bytes)"))
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    if len(contents) >= limits.members:
                        raise _refused(archive, f"holds more than the limit of {limits.members} "
                                       "files (members)")
                    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or member.sparse:
                        raise _refused(archive, f"member {member.name!r} is not a regular file "
                                       "(links, folders, devices and sparse files are refused)")
                    if member.name in contents:
                        raise _refused(archive, f"member {member.name!r} appears twice")
                    if member.size > limits.member_bytes:
                        raise _refused(archive, f"member {member.name!r} is {member.size} bytes, "
                                       f"over the limit of {limits.member_bytes // MIB} MiB "
                                       "(member_bytes)")
                    total += member.size
                    if total > limits.unpacked_bytes:
                        raise _refused(archive, "unpacks to more than the limit of "
                                       f"{limits.unpacked_bytes // MIB} MiB (unpacked_bytes)")
                    contents[member.name] = tar.extractfile(member).read(member.size)
        except (OSError, tarfile.TarError, EOFError, zlib.error) as exc:
            raise InputError([Problem(str(archive), "", f"not a readable evidence archive: {exc}")]
                             ) from None
    return contents


def read_manifest(archive: Path, contents: dict[str, bytes]) -> dict[str, str]:
    """The manifest's {path: sha256}, parsed with the loaders' nesting limit and checked by its
    model; InputError naming the archive's manifest and the field otherwise."""
    where = f"{archive} ({MANIFEST})"
    if MANIFEST not in contents:
        raise InputError([Problem(where, "", "the archive holds no manifest")])
    try:
        text = contents.pop(MANIFEST).decode("utf-8")
    except UnicodeDecodeError:
        raise InputError([Problem(where, "", "not UTF-8 text")]) from None
    data = parse_json(Path(where), text)
    try:
        return ArchiveManifest.model_validate(data, strict=True).files
    except ValidationError as exc:
        raise InputError(problems_from_validation(where, exc)) from None


@dataclass(frozen=True)
class MemberPath:
    root: str  # evidence or artifacts
    host: str
    attempt: str
    rest: tuple[str, ...]  # the file's path inside the attempt's folder

    @property
    def attempt_key(self) -> tuple[str, str]:
        return self.host, self.attempt


def member_path(name: str, archive: Path) -> MemberPath:
    """What a member's name says, if it is one `pack` writes: evidence/<host>/<attempt>/<evidence
    file>, or artifacts/<host>/<attempt>/.../<name>.log|.jsonl; no `..`, no hidden or temp
    file, no absolute path."""
    path = PurePosixPath(name)
    parts = path.parts
    where = ("expected evidence/<host>/<attempt>/<evidence file> or "
             f"artifacts/<host>/<attempt>/.../<file>{'|'.join(ARTIFACT_SUFFIXES)}")
    if (path.is_absolute() or "\\" in name or "\x00" in name or str(path) != name
            or len(parts) < 4 or parts[0] not in (EVIDENCE, ARTIFACTS)):
        raise _refused(archive, f"member {name!r} is not under evidence/<host>/<attempt>/ or "
                       "artifacts/<host>/<attempt>/")
    if any(part in ("..", ".") or part.startswith(".") for part in parts):
        raise _refused(archive, f"member {name!r}: a hidden, temp or '..' name; {where}")
    if parts[0] == EVIDENCE and (len(parts) != 4
                                 or parts[3] not in (ATTEMPT_FILE, *SECTION_FILES)):
        raise _refused(archive, f"member {name!r} is not an evidence file; {where}")
    if parts[0] == ARTIFACTS and not parts[-1].endswith(ARTIFACT_SUFFIXES):
        raise _refused(archive, f"member {name!r}: only logs and timelines travel; {where}")
    return MemberPath(parts[0], parts[1], parts[2], parts[3:])
