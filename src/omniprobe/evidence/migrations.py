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
Version 6 makes offline.json one run per kwarg set or profile (its engine, init, cells, runner
lifetimes, build and settings), where 1-5 had a row per fixture with the runner's logs and
timelines copied into each and an init failure as a row without a fixture; profile-settings.json
is folded into the runs (`fold_settings`) and goes. The Diffusers profiles `cpuoff` and
`cpuoff-expandable` are `model-cpu` and `model-cpu-expandable` (flag sets keep those names).
Version 7 names the Diffusers engine's built env `diffusers`, where 1-6 said `baseline` (a word
that now means only the seed's PSNR baseline): environment.json's `env`, and attempt.json's
`environment.env`.
`update_to_N` turns a file of version N-1 into version N; the loader runs them in order, in
memory (the file on disk is left as it is until the package rewrites it). A version newer than
this package knows is refused by name rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath

FORMAT_VERSION = 7
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


def _rows_updated(file_name: str, data: object, version: int,
                  change: Callable[[list], list] | None) -> object:
    """The data stamped with `version`, its content rows passed through `change` where the
    content is a list (`change` None: the file's rows stay as they are). Data of another shape
    is left for validation to name."""
    if not isinstance(data, dict):
        return data
    data = {**data, VERSION_KEY: version}
    key = content_key(file_name)
    if change is not None and isinstance(data.get(key), list):
        data[key] = change(data[key])
    return data


def update_to_4(file_name: str, data: object) -> object:
    """Version 3 -> 4: an output's structure verdict is `structure` (and `structure_note`), no
    longer `quality`, in every row that carries one."""
    if file_name not in ROWS_RENAMED_IN_4:
        return _rows_updated(file_name, data, 4, None)
    inner = ROWS_RENAMED_IN_4[file_name]
    if inner is None:
        return _rows_updated(file_name, data, 4, lambda rows: [_renamed(row) for row in rows])
    return _rows_updated(file_name, data, 4, lambda rows: [
        {**row, inner: [_renamed(r) for r in row[inner]]}
        if isinstance(row, dict) and isinstance(row.get(inner), list) else row for row in rows])


def _profile_named(row: object, diffusers: bool) -> object:
    if not isinstance(row, dict) or not diffusers or "kwarg_set" not in row or "profile" in row:
        return row
    return {("profile" if k == "kwarg_set" else k): v for k, v in row.items()}


def update_to_5(file_name: str, data: object) -> object:
    """Version 4 -> 5: a Diffusers record names its profile as `profile`. A request says its
    engine; a cell is the Diffusers engine's where it holds what only that engine records."""
    if file_name == "offline-requests.json":
        return _rows_updated(file_name, data, 5, lambda rows: [
            _profile_named(r, isinstance(r, dict) and r.get("engine") == "diffusers")
            for r in rows])
    if file_name == "offline.json":
        return _rows_updated(file_name, data, 5, lambda rows: [
            _profile_named(r, isinstance(r, dict) and (r.get("build") is not None
                                                       or bool(r.get("host_ram"))))
            for r in rows])
    return _rows_updated(file_name, data, 5, None)


# Version 6's renamed Diffusers profiles: a flag set of the same name is another thing.
RENAMED_PROFILES_IN_6 = {"cpuoff": "model-cpu", "cpuoff-expandable": "model-cpu-expandable"}
# The files whose rows name a Diffusers profile as `profile` (version 5 on: only a Diffusers
# record has the key).
PROFILE_FILES_IN_6 = ("offline.json", "offline-requests.json", "profile-settings.json",
                      "capacity.json", "capacity-trials.json")
# A file version 6 folds into another of the same attempt: its content lives there from then on.
FOLDED_IN_6 = {"profile-settings.json": "offline.json"}
# A version 5 row without a fixture and with one of these outcomes is its entry's init failure;
# the InitResult outcome each becomes.
INIT_ROW_OUTCOMES = {"init-oom": "oom", "init-error": "error", "timeout": "timeout"}
# What a version 5 row held of its entry, not its fixture: logs, timelines and host RAM are one
# per runner lifetime, and every row held the same copies.
RUN_KEYS_IN_5 = ("kwarg_set", "profile", "logs", "timelines", "host_ram", "build", "init_s")


def _renamed_profile(row: object) -> object:
    if not isinstance(row, dict) or row.get("profile") not in RENAMED_PROFILES_IN_6:
        return row
    return {**row, "profile": RENAMED_PROFILES_IN_6[row["profile"]]}


def _init_of(rows: list[dict]) -> dict | None:
    """An entry's init as version 6 has it: its last failed init, else ready when a cell says
    how long the build took, else not recorded."""
    failed = [r for r in rows if r.get("fixture") is None and r.get("outcome") in INIT_ROW_OUTCOMES]
    if failed:
        row = failed[-1]
        init = {"outcome": INIT_ROW_OUTCOMES[row["outcome"]], "time_s": row.get("init_s"),
                "oom": row.get("oom"), "note": row.get("note"), "cause": row.get("cause")}
        return {k: v for k, v in init.items() if v is not None}
    timed = [r["init_s"] for r in rows if r.get("init_s") is not None]
    return {"outcome": "ready", "time_s": timed[0]} if timed else None


def _lifetimes_of(row: dict) -> list[dict]:
    logs, timelines, host_ram = (row.get(k) or [] for k in ("logs", "timelines", "host_ram"))
    if not all(isinstance(v, list) for v in (logs, timelines, host_ram)):
        return []
    count = max(len(logs), len(timelines), len(host_ram))
    found = [{"log": logs[i] if i < len(logs) else None,
              "timeline": timelines[i] if i < len(timelines) else None,
              "host_ram": host_ram[i] if i < len(host_ram) else None} for i in range(count)]
    return [{k: v for k, v in lifetime.items() if v is not None} for lifetime in found]


def offline_runs(rows: list) -> list:
    """Version 5's offline.json rows as version 6's runs, one per kwarg set or profile in the
    order each first ran. A row that is no object is kept, for validation to name."""
    groups: dict[tuple[str, object], list[dict]] = {}
    odd = []
    for row in rows:
        if not isinstance(row, dict):
            odd.append(row)
            continue
        key = ("profile", row["profile"]) if "profile" in row else ("kwarg_set", row.get("kwarg_set"))
        groups.setdefault(key, []).append(row)
    runs = []
    for (field, name), mine in groups.items():
        cells = [{k: v for k, v in r.items() if k not in RUN_KEYS_IN_5} for r in mine
                 if not (r.get("fixture") is None and r.get("outcome") in INIT_ROW_OUTCOMES)]
        run = {field: name, "engine": "diffusers" if field == "profile" else "omni",
               "init": _init_of(mine), "cells": cells, "lifetimes": _lifetimes_of(mine[-1]),
               "build": next((r["build"] for r in mine if r.get("build") is not None), None)}
        runs.append({k: v for k, v in run.items() if v is not None})
    return runs + odd


def update_to_6(file_name: str, data: object) -> object:
    """Version 5 -> 6: offline.json holds one run per kwarg set or profile; the Diffusers profiles
    cpuoff and cpuoff-expandable are model-cpu and model-cpu-expandable."""
    if file_name not in PROFILE_FILES_IN_6:
        return _rows_updated(file_name, data, 6, None)

    def changed(rows: list) -> list:
        rows = [_renamed_profile(row) for row in rows]
        return offline_runs(rows) if file_name == "offline.json" else rows

    return _rows_updated(file_name, data, 6, changed)


def fold_settings(offline: object, settings: object) -> object:
    """offline.json's version 6 data with a version 6 profile-settings.json's rows folded into
    its runs: each profile's settings on its run, a profile whose run recorded nothing else a run
    of its own (its settings were written as it began). Data of another shape is left as it is,
    for validation to name."""
    rows = settings.get(content_key("profile-settings.json")) if isinstance(settings, dict) else None
    if not isinstance(offline, dict) or not isinstance(rows, list):
        return offline
    runs = list(offline.get("offline") or [])
    for row in rows:
        if not isinstance(row, dict):
            continue
        at = next((i for i, run in enumerate(runs) if isinstance(run, dict)
                   and run.get("profile") == row.get("profile")), None)
        if at is None:
            runs.append({"profile": row.get("profile"), "engine": "diffusers",
                         "settings": row.get("settings")})
        else:
            runs[at] = {**runs[at], "settings": row.get("settings")}
    return {**offline, "offline": runs}


# Version 7's renamed env name.
RENAMED_ENVS_IN_7 = {"baseline": "diffusers"}


def _env_renamed(holder: object, key: str) -> object:
    """`holder` with the env that `holder[key]` names renamed; anything else as it is."""
    found = holder.get(key) if isinstance(holder, dict) else None
    if not isinstance(found, dict) or found.get("env") not in RENAMED_ENVS_IN_7:
        return holder
    return {**holder, key: {**found, "env": RENAMED_ENVS_IN_7[found["env"]]}}


def update_to_7(file_name: str, data: object) -> object:
    """Version 6 -> 7: the Diffusers engine's env is `diffusers`, no longer `baseline`, in
    environment.json and in attempt.json's environment."""
    data = _rows_updated(file_name, data, 7, None)
    if file_name == "environment.json":
        return _env_renamed(data, "environment")
    if file_name == "attempt.json" and isinstance(data, dict) and "attempt" in data:
        return {**data, "attempt": _env_renamed(data["attempt"], "environment")}
    return data


MIGRATIONS: dict[int, Callable[[str, object], object]] = {
    2: update_to_2, 3: update_to_3, 4: update_to_4, 5: update_to_5, 6: update_to_6,
    7: update_to_7}
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
