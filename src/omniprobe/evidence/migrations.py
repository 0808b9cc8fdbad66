"""The evidence format's version, and the migrations that read an older file as the current one.

Every evidence file is `{"format_version": N, "<content key>": ...}`: one wrapping convention
for every file, so an object (attempt.json) and a list (requests.json) carry their version the
same way. The content key is named for the file (`requests.json` -> `requests`).

Version 1 is the unversioned format: the content alone, an object or a list, with no wrapper.
`update_to_N` turns a file of version N-1 into version N; the loader runs them in order, in
memory (the file on disk is left as it is until the package rewrites it). A version newer than
this package knows is refused by name rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Callable

FORMAT_VERSION = 2
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


MIGRATIONS: dict[int, Callable[[str, object], object]] = {2: update_to_2}
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
