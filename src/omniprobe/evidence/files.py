"""The evidence files: each file's content wrapped with its format version, parsed (migrated,
validated, cached) and written."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, create_model

from omniprobe.atomic import write_text_atomic
from omniprobe.config.strict import STRICT
from omniprobe.errors import InputError, Problem, problems_from_validation
from omniprobe.evidence.migrations import (
    FOLDED_IN_6,
    FORMAT_VERSION,
    VERSION_KEY,
    UnknownFormatVersion,
    content_key,
    fold_settings,
    upgrade,
    version_of,
)
from omniprobe.evidence.models.attempt import Attempt
from omniprobe.evidence.models.capacity import CapacityTrial, ProfileSearch
from omniprobe.evidence.models.environment import EnvManifest
from omniprobe.evidence.models.offline import OfflineRequest, OfflineRun
from omniprobe.evidence.models.outputs import (
    Baseline,
    DeterminismGroup,
    PropagationCheck,
    PsnrRow,
    StructureObservation,
)
from omniprobe.evidence.models.requests import RequestRecord
from omniprobe.evidence.models.runs import ServeRun
from omniprobe.evidence.models.statements import CodeLocation, Correction, Finding, StatedFigure
from omniprobe.evidence.upstream import UpstreamContract
from omniprobe.safe_io import parse_json, read_text

# Each file's content; the file itself wraps it with its format version (evidence/migrations.py).
FILE_CONTENT: dict[str, type] = {
    "attempt.json": Attempt,
    "runs.json": list[ServeRun],
    "requests.json": list[RequestRecord],
    "offline.json": list[OfflineRun],
    "offline-requests.json": list[OfflineRequest],
    "capacity.json": list[ProfileSearch],
    "capacity-trials.json": list[CapacityTrial],
    "structure.json": list[StructureObservation],
    "psnr.json": list[PsnrRow],
    "determinism.json": list[DeterminismGroup],
    "propagation.json": list[PropagationCheck],
    "code-read.json": list[CodeLocation],
    "baseline.json": Baseline,
    "corrections.json": list[Correction],
    "figures.json": list[StatedFigure],
    "findings.json": list[Finding],
    "environment.json": EnvManifest,
    "upstream.json": UpstreamContract,
}
ATTEMPT_FILE = "attempt.json"


def _file_model(file_name: str, content: type) -> type[BaseModel]:
    key = content_key(file_name)
    return create_model(
        "".join(part.title() for part in key.split("_")) + "File",
        __config__=STRICT,
        __doc__=f"{file_name}: the evidence format version, then the content under {key!r}.",
        **{VERSION_KEY: (Literal[FORMAT_VERSION], Field(
            description="Evidence format version; a file without it is version 1 and is "
                        "migrated on load.")),
           key: (content, ...)},
    )


FILE_MODELS: dict[str, type[BaseModel]] = {
    name: _file_model(name, content) for name, content in FILE_CONTENT.items()}
SECTION_FILES = [name for name in FILE_MODELS if name != ATTEMPT_FILE]


# Validated contents by (file name, text): a content is a pure function of the two, and a process
# that loads the evidence again (validate then report; the tests) parses each text once. Only
# successes are kept, so every error still names the file it came from.
_PARSED: dict[tuple[str, str], object] = {}
_PARSED_MAX = 1024


def parse_file(path: Path, text: str | None = None):
    """One evidence file's content, its kind told by its name, migrated from an older format
    version; raise InputError naming the file and the JSON path of every problem."""
    text = read_text(path) if text is None else text
    key = (path.name, text)
    if key not in _PARSED:
        if len(_PARSED) >= _PARSED_MAX:
            del _PARSED[next(iter(_PARSED))]
        _PARSED[key] = _parse(path, text)
    value = _PARSED[key]
    # The models are frozen; a section that is a list is copied, so appending to it (a probe
    # resuming its attempt) changes no other reader's.
    return list(value) if isinstance(value, list) else value


def _parse(path: Path, text: str):
    model = FILE_MODELS[path.name]
    data, found = _upgraded(path, parse_json(path, text))
    try:
        # Validated as JSON, strictly: timestamps are ISO text there, and nothing is coerced.
        value = model.model_validate_json(text if found == FORMAT_VERSION else json.dumps(data),
                                          strict=True)
    except ValidationError as exc:
        problems = problems_from_validation(path, exc)
        if found != FORMAT_VERSION:
            problems = [replace(p, message=f"{p.message} (a format version {found} file, "
                                           f"path as in version {FORMAT_VERSION})")
                        for p in problems]
        raise InputError(problems) from None
    return getattr(value, content_key(path.name))


def _upgraded(path: Path, data: object) -> tuple[object, int]:
    try:
        return upgrade(path.name, data)
    except UnknownFormatVersion as exc:
        raise InputError([Problem(str(path), f"$.{VERSION_KEY}", str(exc))]) from None


def folded_files(folder: Path) -> list[Path]:
    """The attempt's files of a format before 6 that version 6 folds into another of its files."""
    return [folder / name for name in FOLDED_IN_6 if (folder / name).is_file()]


def folded_text(folder: Path) -> tuple[Path, str] | None:
    """The file a pre-6 file of the attempt folds into (offline.json, profile-settings.json
    folded in), and its text in the current format; None: the attempt has no such file."""
    found = folded_files(folder)
    if not found:
        return None
    legacy = found[0]
    settings = parse_json(legacy, read_text(legacy))
    try:
        version = version_of(settings)
    except UnknownFormatVersion as exc:
        raise InputError([Problem(str(legacy), f"$.{VERSION_KEY}", str(exc))]) from None
    if version >= 6:
        raise InputError([Problem(str(legacy), f"$.{VERSION_KEY}", (
            f"format version {version}: from version 6 on, {legacy.name} lives in "
            f"{FOLDED_IN_6[legacy.name]} (each run's settings), and no attempt has this file"))])
    target = folder / FOLDED_IN_6[legacy.name]
    offline = (parse_json(target, read_text(target)) if target.is_file()
               else {VERSION_KEY: FORMAT_VERSION, content_key(target.name): []})
    data = fold_settings(_upgraded(target, offline)[0], _upgraded(legacy, settings)[0])
    return target, json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def dump_json(file_name: str, content) -> str:
    """A file's text in the current format version, validated exactly as it will be on load."""
    checked = FILE_MODELS[file_name].model_validate(
        {VERSION_KEY: FORMAT_VERSION, content_key(file_name): content})
    return checked.model_dump_json(indent=2, exclude_none=True) + "\n"


def write_section(folder: Path, file_name: str, content) -> Path:
    """Validate, then write one evidence file atomically; a bad value leaves the old file intact."""
    return write_text_atomic(folder / file_name, dump_json(file_name, content))
