"""The evidence format's version, and the migrations that read an older file as the current one.

Every evidence file is `{"format_version": N, "<content key>": ...}`: one wrapping convention
for every file, so an object (attempt.json) and a list (requests.json) carry their version the
same way. The content key is named for the file (`requests.json` -> `requests`).

Version 1 is the unversioned format: the content alone, an object or a list, with no wrapper.
Version 3 names a transcribed attempt's source document by file name and sha256, not a path.
Version 4 calls an output's structure verdict `structure` (and its note `structure_note`), where
versions 1-3 said `quality`: "quality" now means only the PSNR comparison with a baseline.
Version 5 names a Diffusers engine's configuration `profile`, no longer `kwarg_set` (an Omni
engine's keeps `kwarg_set`): in offline-requests.json by the record's own `engine`, in offline.json
by what only a Diffusers run records (its `build`, its emulated `host_ram`). Runs from before 5
did not record their profile's settings (profile-settings.json, new in 5): their attempts say so.
`update_to_N` turns a file of version N-1 into version N; the loader runs them in order, in
memory (the file on disk is left as it is until the package rewrites it). A version newer than
this package knows is refused by name rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath

FORMAT_VERSION = 5
VERSION_KEY = "format_version"


class UnknownFormatVersion(ValueError):
    """A file whose format version this package cannot read."""


def content_key(file_name: str) -> str:
    """The key a file's content lives under: `offline-requests.json` -> `offline_requests`."""
    return file_name.removesuffix(".json").replace("-", "_")


def content_path(file_name: str, path: str = "$") -> str:
    """A JSON path into a file's content (`$[2].seed`) as a path into the file (`$.requests[2].seed`)."""
    if not path.startswith("$"):
        raise ValueError(f"not a JSON path: {path!r}")
    rest = path[1:]
    return f"$.{content_key(file_name)}{rest if not rest or rest[0] in '.[' else '.' + rest}"


def update_to_2(file_name: str, data: object) -> dict:
    """Version 1 (the bare content) -> version 2 (the content under its key, with the version)."""
    return {VERSION_KEY: 2, content_key(file_name): data}


def update_to_3(file_name: str, data: object) -> object:
    """Version 2 -> 3: a transcribed attempt names its source document by file name and sha256
    (`{"name", "sha256"}`) instead of a path; version 2 recorded no digest, so it is null."""
    if not isinstance(data, dict):
        return data
    data = {**data, VERSION_KEY: 3}
    attempt = data.get("attempt") if file_name == "attempt.json" else None
    provenance = attempt.get("provenance") if isinstance(attempt, dict) else None
    if (isinstance(provenance, dict) and provenance.get("kind") == "transcribed"
            and isinstance(provenance.get("source"), str)):
        named = {"name": PurePosixPath(provenance["source"]).name, "sha256": None}
        data["attempt"] = {**attempt, "provenance": {**provenance, "source": named}}
    return data


# Version 4's renamed keys, and where in each file the rows that carry them are: the file's own
# list, or a list inside each of its rows (runs.json: every run's cells).
RENAMED_IN_4 = {"quality": "structure", "quality_note": "structure_note"}
ROWS_RENAMED_IN_4: dict[str, str | None] = {
    "requests.json": None, "offline-requests.json": None, "offline.json": None,
    "structure.json": None, "psnr.json": None, "runs.json": "cells"}


def _renamed(row: object) -> object:
    if not isinstance(row, dict):
        return row
    # A key already under its new name stays, and the old one with it, for validation to name.
    return {(new if (new := RENAMED_IN_4.get(k)) and new not in row else k): v
            for k, v in row.items()}


def update_to_4(file_name: str, data: object) -> object:
    """Version 3 -> 4: an output's structure verdict is `structure` (and `structure_note`), no
    longer `quality`, in every row that carries one."""
    if not isinstance(data, dict):
        return data
    data = {**data, VERSION_KEY: 4}
    key = content_key(file_name)
    rows = data.get(key)
    if file_name not in ROWS_RENAMED_IN_4 or not isinstance(rows, list):
        return data
    inner = ROWS_RENAMED_IN_4[file_name]
    if inner is None:
        data[key] = [_renamed(row) for row in rows]
    else:
        data[key] = [{**row, inner: [_renamed(r) for r in row[inner]]}
                     if isinstance(row, dict) and isinstance(row.get(inner), list) else row
                     for row in rows]
    return data


def _profile_named(row: object, diffusers: bool) -> object:
    if not isinstance(row, dict) or not diffusers or "kwarg_set" not in row or "profile" in row:
        return row
    return {("profile" if k == "kwarg_set" else k): v for k, v in row.items()}


def update_to_5(file_name: str, data: object) -> object:
    """Version 4 -> 5: a Diffusers record names its profile as `profile`. A request says its
    engine; a cell is the Diffusers engine's where it holds what only that engine records."""
    if not isinstance(data, dict):
        return data
    data = {**data, VERSION_KEY: 5}
    rows = data.get(content_key(file_name))
    if not isinstance(rows, list):
        return data
    if file_name == "offline-requests.json":
        data["offline_requests"] = [
            _profile_named(r, isinstance(r, dict) and r.get("engine") == "diffusers")
            for r in rows]
    elif file_name == "offline.json":
        data["offline"] = [
            _profile_named(r, isinstance(r, dict) and (r.get("build") is not None
                                                       or bool(r.get("host_ram"))))
            for r in rows]
    return data


MIGRATIONS: dict[int, Callable[[str, object], object]] = {
    2: update_to_2, 3: update_to_3, 4: update_to_4, 5: update_to_5}
KNOWN_VERSIONS = range(1, FORMAT_VERSION + 1)


def version_of(data: object) -> int:
    """The format version a parsed file declares; a file without one is version 1."""
    if not isinstance(data, dict) or VERSION_KEY not in data:
        return 1
    version = data[VERSION_KEY]
    if type(version) is not int or version not in KNOWN_VERSIONS:
        known = ", ".join(str(v) for v in KNOWN_VERSIONS)
        raise UnknownFormatVersion(
            f"format version {version!r} is not one this omniprobe reads (it knows {known}; "
            "version 1 is a file without the field); a newer omniprobe may have written it")
    return version


def upgrade(file_name: str, data: object) -> tuple[object, int]:
    """The file's data as the current version, and the version it was written in."""
    found = version_of(data)
    for target in range(found + 1, FORMAT_VERSION + 1):
        data = MIGRATIONS[target](file_name, data)
    return data, found
