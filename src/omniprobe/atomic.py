"""Atomic file writes: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from omniprobe.errors import EnvironmentFailure

TEMP_SUFFIX = ".tmp"  # `.<name>.<random>.tmp`: a write in flight, or left by a killed writer


def is_temp_file(path: Path) -> bool:
    return path.name.startswith(".") and path.name.endswith(TEMP_SUFFIX)


def _umask() -> int:
    """The process's umask, read without changing it (os.umask would, for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


# mkstemp makes its file 0600; a written file gets the mode a plain open() would give it.
_NEW_FILE_MODE = 0o666 & ~_umask()


class NotWritable(EnvironmentFailure):
    """A folder evidence or artifacts go to cannot be written."""


def require_writable(folder: Path, what: str) -> None:
    """Write and remove a small file in `folder`, as a record will be written; NotWritable naming
    it otherwise. Folders it had to make are removed again: a check leaves no trace. Run before a
    server starts: on a real host a failed write after the model has loaded costs minutes."""
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(folder / ".omniprobe-write-check", b"ok\n").unlink()
    except OSError as exc:
        raise NotWritable(f"{what} {folder} cannot be written: {exc.strerror or exc}") from None
    finally:
        for path in made:  # innermost first
            with contextlib.suppress(OSError):
                path.rmdir()


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write `path` through a temp file beside it. An OSError names `path` (or the folder that
    is not one), never the temp file: the user did not name that."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise NotADirectoryError(errno.ENOTDIR, "a file where a folder belongs",
                                 str(path.parent)) from None
    try:
        return _write(path, data)
    except OSError as exc:
        if exc.filename == str(path) and exc.filename2 is None:
            raise
        reason = "is a folder where a file belongs" if path.is_dir() else exc.strerror
        raise type(exc)(exc.errno, reason, str(path)) from None


def _write(path: Path, data: bytes) -> Path:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)  # a rewritten file keeps its mode
        except FileNotFoundError:
            mode = _NEW_FILE_MODE
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
