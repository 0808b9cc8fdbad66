"""Evidence files written in an older format version, rewritten as the current one
(`omniprobe evidence upgrade`): the loader migrates them in memory; this makes it so on disk."""

from __future__ import annotations

import json
from pathlib import Path

from omniprobe.atomic import write_text_atomic
from omniprobe.errors import InputError, Problem
from omniprobe.evidence.files import FILE_MODELS, folded_files, folded_text, parse_file
from omniprobe.evidence.load import load_evidence
from omniprobe.evidence.migrations import (
    FORMAT_VERSION,
    VERSION_KEY,
    UnknownFormatVersion,
    upgrade,
    version_of,
)
from omniprobe.safe_io import parse_json, read_text


def older_files(evidence_dir: Path) -> list[tuple[Path, int]]:
    """Each evidence file under evidence/<host>/<attempt>/ in an older format version, with it;
    InputError naming every file whose version is one this omniprobe does not know (a newer
    one's, or not a version at all): it is not "older", and no upgrade makes it current."""
    found, problems = [], []
    for path in sorted(evidence_dir.glob("*/*/*.json")):
        # A file version 6 folds into another is of a format before 6, whatever it says.
        if path.name in FILE_MODELS or path in folded_files(path.parent):
            try:
                version = version_of(parse_json(path, read_text(path)))
            except UnknownFormatVersion as exc:
                problems.append(Problem(str(path), f"$.{VERSION_KEY}", str(exc)))
                continue
            if version < FORMAT_VERSION or path.name not in FILE_MODELS:
                found.append((path, version))
    if problems:
        raise InputError(problems)
    return found


def upgrade_evidence(evidence_dir: Path) -> list[tuple[Path, int]]:
    """Rewrite every older file in the current format version, each atomically (a file folded
    into another, written into it, then removed). The whole evidence tree is validated first,
    and every new text made before the first is written: a problem anywhere leaves every file
    as it was."""
    if not evidence_dir.is_dir():
        raise InputError([Problem(str(evidence_dir), "", "evidence folder not found")])
    _, problems = load_evidence(evidence_dir)
    if problems:
        raise InputError(problems)
    older = older_files(evidence_dir)
    folders = dict.fromkeys(path.parent for path, _ in older)
    legacy = [path for folder in folders for path in folded_files(folder)]
    texts = dict(filter(None, (folded_text(folder) for folder in folders)))
    texts.update({path: upgraded_text(path) for path, _ in older
                  if path not in texts and path not in legacy})
    for path, text in texts.items():
        write_text_atomic(path, text)
    for path in legacy:  # its content now lives in the file it folds into
        path.unlink()
    return older


def upgraded_text(path: Path) -> str:
    """The file as its migrations leave it, and nothing more: keys in their order, and no
    default of a field newer than the file filled in (the loader reads those the same way)."""
    data, _ = upgrade(path.name, parse_json(path, read_text(path)))
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    parse_file(path, text)  # the current format's validation, naming the file on a problem
    return text
