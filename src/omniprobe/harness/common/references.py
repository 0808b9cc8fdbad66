"""A fixture's reference images: where each is, inside fixtures/, and each checked against its pinned
sha256 before anything is sent or built."""

from __future__ import annotations

from pathlib import Path

from omniprobe.config.fixtures import (
    MAX_REFERENCE_BYTES,
    Fixture,
    ReferenceImage,
    reference_file_problem,
)
from omniprobe.digests import sha256_bytes
from omniprobe.errors import InputError, Problem
from omniprobe.safe_io import MissingFile, confine, read_bytes


class ReferenceMismatch(InputError):
    """A reference image on disk is missing, or not the one the fixture pins by sha256."""


def reference_path(fixture: Fixture, ref: ReferenceImage, fixtures_dir: Path) -> Path:
    """Where a reference image is: inside fixtures/, or InputError naming the fixture's field."""
    return confine(fixtures_dir, ref.file, file=fixtures_dir / "fixtures.json",
                   field=f"fixture {fixture.id!r} reference {ref.name!r} key 'file'")


def load_references(fixture: Fixture, fixtures_dir: Path) -> list[tuple[str, bytes]]:
    """The fixture's reference images, each checked against its pinned sha256;
    ReferenceMismatch names every file that is missing or differs, with both digests."""
    loaded, problems = [], []
    for ref in fixture.references or []:
        try:
            path = reference_path(fixture, ref, fixtures_dir)
            data = read_bytes(path, max_bytes=MAX_REFERENCE_BYTES)
        except MissingFile:
            path = fixtures_dir / ref.file
            problems.append(Problem(str(path), "", f"reference {ref.name!r} of fixture "
                                                   f"{fixture.id!r} is missing"))
            continue
        except InputError as exc:
            problems += exc.problems
            continue
        digest = sha256_bytes(data)
        if digest != ref.sha256:
            problems.append(Problem(str(path), "", f"sha256 {digest} differs from {ref.sha256}, "
                                                   f"the digest fixtures.json pins for reference "
                                                   f"{ref.name!r} of fixture {fixture.id!r}"))
        loaded.append((path.name, data))
    if problems:
        raise ReferenceMismatch(problems)
    return loaded


def require_references(fixtures: list[Fixture], fixtures_dir: Path, *, max_pixels: int) -> None:
    """Every reference of the fixtures against its pin, and as an image that decodes completely
    within `max_pixels`, before any request (or attempt) exists: a file the server could not
    read is the input's fault, not the server's."""
    problems = []
    for fixture in fixtures:
        try:
            loaded = load_references(fixture, fixtures_dir)
        except ReferenceMismatch as exc:
            problems += exc.problems
            continue
        # Each file's bytes matched its pin in load_references: ref.sha256 is their digest.
        for ref, (_, data) in zip(fixture.references or [], loaded, strict=True):
            path = reference_path(fixture, ref, fixtures_dir)
            unfit = reference_file_problem(path, data, ref.sha256, max_pixels)
            if unfit is not None:
                problems.append(Problem(str(path), "", f"reference {ref.name!r} of fixture "
                                                       f"{fixture.id!r}: {unfit}"))
    if problems:
        raise ReferenceMismatch(problems)
