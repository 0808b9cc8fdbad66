"""Reading what a file or a user names, safely: one loader for text files and one confinement of
the paths that configuration and evidence name.

Every loader reads through `read_text` (a regular file, UTF-8, at most MAX_TEXT_BYTES) and
`load_json` / `load_toml` (at most MAX_NESTING levels of arrays and tables, checked before the
parser runs, so a hostile file cannot exhaust Python's recursion limit). Every path a file names
goes through `relative_inside` (in a model, as the field type `InsidePath`: relative, no `..`)
and `confine` (at use: it resolves inside its folder, symlinks included). Each refusal is an
InputError naming the file and the field. No pydantic here: the sim reads with this module too.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import stat
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

from omniprobe.errors import InputError, Problem

MAX_TEXT_BYTES = 64 * 1024**2  # far above the largest evidence file (10,000 requests: ~8 MB)
MAX_NESTING = 64  # the deepest committed file nests 8 levels

# What may hold a bracket that is not structure: strings (and TOML's comments), unrolled so the
# scan stays in C (a 10,000-record file takes milliseconds).
_JSON_TEXT = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_TOML_TEXT = re.compile(r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
                        r'|\'[^\'\n]*\'|#[^\n]*')
_BRACKETS = re.compile(r"[^\[\]{}\n]+")


class MissingFile(InputError):
    """The named file does not exist."""


def _problem(path: Path, message: str, where: str = "") -> InputError:
    return InputError([Problem(str(path), where, message)])


def regular_file(path: str | Path) -> Path:
    """`path`, if it is a regular file (following symlinks); else InputError saying what it is.
    A FIFO or device is refused before it is opened, so reading it cannot hang."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise MissingFile([Problem(str(path), "", "file not found")]) from None
    except OSError as exc:
        raise _problem(path, f"cannot read: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise _problem(path, "is a folder; expected a file")
    if not stat.S_ISREG(mode):
        raise _problem(path, "is not a regular file (a FIFO, socket or device); expected a file")
    return path


def read_bytes(path: str | Path, *, max_bytes: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of a regular file of at most `max_bytes`; InputError naming the file otherwise."""
    path = regular_file(path)
    try:
        with open(path, "rb") as handle:
            # Sized by the file, not by the bound: a read(max_bytes + 1) allocates the whole
            # bound first (64 MiB a read, five times the cost of a small file's read).
            expected = os.fstat(handle.fileno()).st_size
            data = handle.read(min(expected, max_bytes) + 1)
            if len(data) > expected:  # it grew since: read on, up to the bound
                data += handle.read(max_bytes + 1 - len(data))
    except OSError as exc:
        raise _problem(path, f"cannot read: {exc.strerror}") from None
    if len(data) > max_bytes:
        raise _problem(path, f"larger than the limit of {max_bytes} bytes")
    return data


def read_text(path: str | Path, *, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """A text file's content: a regular file, UTF-8, at most `max_bytes`."""
    path = Path(path)
    data = read_bytes(path, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise _problem(path, f"not UTF-8 text: byte {data[exc.start]:#04x} cannot be decoded",
                       f"line {line} (byte {exc.start})") from None


def _nesting_problem(path: Path, text: str, strings: re.Pattern) -> InputError | None:
    """An InputError when arrays and tables nest deeper than MAX_NESTING (brackets inside
    strings and comments do not count)."""
    # JSON strings hold no raw newline; TOML's multi-line ones keep theirs, for the line number.
    blank = "" if strings is _JSON_TEXT else (lambda m: "\n" * m.group().count("\n"))
    structure = _BRACKETS.sub("", strings.sub(blank, text))  # brackets and newlines only
    depth, line = 0, 1
    for char in structure:
        if char == "\n":
            line += 1
        elif char in "[{":
            depth += 1
            if depth > MAX_NESTING:
                return _problem(path, f"nested deeper than {MAX_NESTING} levels of arrays and "
                                      "tables", f"line {line}")
        else:
            depth -= 1
    return None


def _parse_nested(path: Path, text: str, strings: re.Pattern, parse) -> Any:
    """`parse(text)` once the nesting check has passed; InputError naming the file otherwise."""
    too_deep = _nesting_problem(path, text, strings)
    if too_deep:
        raise too_deep
    try:
        return parse(text)
    except RecursionError:  # a backstop: the nesting check above stops what reaches this
        raise _problem(path, "nested too deeply to parse") from None


class DuplicateKey(ValueError):
    """A JSON object names a key twice: the parser would keep the last one silently."""

    def __init__(self, key: str):
        super().__init__(f"the key {key!r} appears twice in one object; a second value would "
                         "silently replace the first")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise DuplicateKey(key)
        found[key] = value
    return found


def json_loads(text: str | bytes) -> Any:
    """json.loads that refuses an object with a repeated key (DuplicateKey, a ValueError)."""
    return json.loads(text, object_pairs_hook=_unique_keys)


def parse_json(path: Path, text: str) -> Any:
    """JSON text of `path`, nesting checked first; InputError with the line of a syntax error
    or naming a repeated key."""
    try:
        return _parse_nested(path, text, _JSON_TEXT, json_loads)
    except json.JSONDecodeError as exc:
        raise _problem(path, f"not valid JSON (truncated or malformed): {exc.msg}",
                       f"line {exc.lineno} column {exc.colno}") from None
    except DuplicateKey as exc:
        raise _problem(path, f"not valid evidence JSON: {exc}") from None


def load_json(path: str | Path) -> Any:
    path = Path(path)
    return parse_json(path, read_text(path))


def load_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    return toml_text(path, read_text(path))


@functools.lru_cache(maxsize=32)
def _parsed_toml(text: str) -> dict[str, Any]:
    # A parse is a pure function of the text: a process that loads hosts.toml again (every
    # command the tests run in process, a copy of the project) parses each text once.
    return tomllib.loads(text)


def toml_text(path: Path, text: str) -> dict[str, Any]:
    """`text` parsed as TOML; an InputError naming `path` where it is not. The caller gets its
    own copy, free to change."""
    try:
        return copy.deepcopy(_parse_nested(path, text, _TOML_TEXT, _parsed_toml))
    except tomllib.TOMLDecodeError as exc:
        raise _problem(path, f"not valid TOML: {exc}") from None


# --- paths a file names -----------------------------------------------------------------


def relative_inside(value: str) -> str:
    """`value`, if it is a path relative to its folder that does not climb out of it."""
    if not value or value.strip() != value:
        raise ValueError(f"expected a relative path inside its folder, got {value!r}")
    if "\\" in value or "\x00" in value:
        raise ValueError(f"expected a '/'-separated path without NUL, got {value!r}")
    path = PurePosixPath(value)
    if path.is_absolute() or value.startswith("~"):
        raise ValueError(f"expected a path relative to its folder, got the absolute {value!r}")
    if ".." in path.parts:
        raise ValueError(f"expected a path inside its folder, got {value!r}, which climbs out "
                         "with '..'")
    return value


def confine(base: Path, relative: str | Path, *, file: str | Path, field: str) -> Path:
    """`base / relative`, resolved, if it lies inside `base` (resolved): no absolute path, no
    `..` out, no symlink out. InputError naming the file and field that named it otherwise."""
    try:
        relative_inside(str(relative))
    except ValueError as exc:
        raise InputError([Problem(str(file), field, str(exc))]) from None
    root = base.resolve()
    target = (base / relative).resolve()
    if not target.is_relative_to(root):
        raise InputError([Problem(str(file), field, f"{relative}: resolves outside {base}")])
    return target


def outside(path: Path, real_root: Path) -> Path | None:
    """Where `path` really is, if a symlink takes it out of `real_root` (a resolved folder); None
    when it stays inside."""
    real = path.resolve()
    return None if real.is_relative_to(real_root) else real

