"""An unpack as a transaction over two trees: everything is staged beside evidence/ and
artifacts/ (in folders git ignores), validated, then moved into place by renames listed in a
journal written before the first. After an interrupt at any point, the next `omniprobe evidence`
command completes the moves (a journal was written: everything had been validated) or rolls the
staging back (no journal: nothing had moved), and says which. One unpack at a time, by a lock."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from omniprobe.atomic import write_text_atomic
from omniprobe.config.project import Project
from omniprobe.errors import EnvironmentFailure, InputError, Problem, problems_from_validation
from omniprobe.evidence.models.archive import JournalledMove, UnpackJournal
from omniprobe.safe_io import load_json

STAGING = ".omniprobe-unpack"  # in the project's root and in artifacts/; .gitignore names it
JOURNAL = "journal.json"
LOCK = "lock"


class UnpackBusy(EnvironmentFailure):
    """Another unpack of this project holds the lock."""


@dataclass(frozen=True)
class Staging:
    """One unpack's staging folders: evidence/ and artifacts/ trees, each on its target's file
    system, so every move is one rename."""

    evidence: Path
    artifacts: Path
    journal: Path

    @property
    def folders(self) -> tuple[Path, Path]:
        return self.evidence.parent, self.artifacts


def _roots(project: Project) -> tuple[Path, Path]:
    return project.root / STAGING, project.artifacts_dir / STAGING


@contextlib.contextmanager
def locked(project: Project) -> Iterator[None]:
    """Hold the project's unpack lock; UnpackBusy at once if another command holds it."""
    root = _roots(project)[0]
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UnpackBusy(f"another `omniprobe evidence` command is unpacking into "
                             f"{project.root} (it holds {root / LOCK}); run this one after it"
                             ) from None
        yield


def new_staging(project: Project) -> Staging:
    evidence_root, artifacts_root = _roots(project)
    name = uuid.uuid4().hex
    staging = Staging(evidence_root / name / "evidence", artifacts_root / name,
                      evidence_root / name / JOURNAL)
    staging.evidence.mkdir(parents=True)
    staging.artifacts.mkdir(parents=True)
    return staging


def discard(staging: Staging) -> None:
    """Remove the staged trees; the staging folders too once no journal is left in them."""
    for folder in (staging.evidence, staging.artifacts):
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(folder.parent / f"{folder.name}.replaced", ignore_errors=True)
    if not staging.journal.exists():
        for folder in (staging.evidence.parent, staging.artifacts.parent):
            with contextlib.suppress(OSError):  # left where another unpack stages beside it
                folder.rmdir()


Move = tuple[Path, Path, Path | None]  # staged, target, where a replaced target is set aside


def replaced_path(staging: Staging, staged: Path) -> Path | None:
    """Where a target the staged folder replaces is set aside: beside the staged tree, on the
    same file system, removed with the staging; None for a folder outside both staged trees."""
    tree = next((f for f in (staging.evidence, staging.artifacts) if staged.is_relative_to(f)),
                None)
    return None if tree is None else tree.parent / f"{tree.name}.replaced" / staged.relative_to(tree)


def commit(staging: Staging, moves: list[Move]) -> None:
    """Journal the moves, make them, then remove the journal and the staging folders."""
    write_text_atomic(staging.journal, UnpackJournal(moves=[
        JournalledMove(staged=str(a), target=str(b), replaced=None if c is None else str(c))
        for a, b, c in moves]).model_dump_json(indent=1))
    _move(staging, moves)


def _move(staging: Staging, moves: list[Move]) -> int:
    """Make each move not made yet; how many it made. A target that appeared since it was
    checked is named, and the journal stays for the next command. A target the move replaces is
    set aside first, so an interrupt between the two renames leaves the staged folder to move."""
    made = 0
    for staged, target, replaced in moves:
        if not staged.exists() and target.exists():
            continue  # moved before the interrupt
        if replaced is not None and target.exists() and staged.is_dir():
            replaced.parent.mkdir(parents=True, exist_ok=True)
            os.rename(target, replaced)
        if target.exists() or not staged.is_dir():
            why = f"{target} exists" if target.exists() else f"{staged} is missing"
            raise EnvironmentFailure(f"cannot complete the unpack journalled in {staging.journal}: "
                                     f"{why}")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, target)
        made += 1
    discard(staging)
    staging.journal.unlink()  # from here a remnant is an empty folder
    discard(staging)
    return made


def _journal_moves(staging: Staging, project: Project) -> list[Move]:
    """The journal's moves, each from this staging into evidence/ or artifacts/."""
    try:
        journal = UnpackJournal.model_validate(load_json(staging.journal), strict=True)
    except ValidationError as exc:
        raise InputError(problems_from_validation(staging.journal, exc)) from None
    moves = [(Path(m.staged), Path(m.target), None if m.replaced is None else Path(m.replaced))
             for m in journal.moves]
    for i, (staged, target, replaced) in enumerate(moves):
        inside = [root for root in (project.evidence_dir, project.artifacts_dir)
                  if target.resolve().is_relative_to(root.resolve())]
        if not inside or not any(staged.is_relative_to(f) for f in staging.folders) or (
                replaced is not None and replaced != replaced_path(staging, staged)):
            raise InputError([Problem(str(staging.journal), f"$.moves[{i}]",
                                      "expected a move from this unpack's staging folders into "
                                      "evidence/ or artifacts/, setting a replaced folder aside "
                                      "only beside its staged tree")])
    return moves


def pending(project: Project) -> list[Path]:
    """The journals of unpacks an interrupt left half moved."""
    root = _roots(project)[0]
    return sorted(root.glob(f"*/{JOURNAL}")) if root.is_dir() else []


def recover(project: Project) -> list[str]:
    """Complete or roll back each unpack an interrupt left; a line saying what was done, each.
    Call it holding the lock."""
    evidence_root, artifacts_root = _roots(project)
    said = []
    names = {p.name for root in (evidence_root, artifacts_root) if root.is_dir()
             for p in root.iterdir() if p.is_dir()}
    for name in sorted(names):
        staging = Staging(evidence_root / name / "evidence", artifacts_root / name,
                          evidence_root / name / JOURNAL)
        if staging.journal.is_file():
            made = _move(staging, _journal_moves(staging, project))
            said.append(f"completed an interrupted unpack: moved the {made} folder(s) it had "
                        f"not moved yet into place (journal {staging.journal})")
        elif staging.evidence.exists() or staging.artifacts.exists():
            discard(staging)
            said.append(f"rolled back an interrupted unpack: it had journalled no move, so "
                        f"nothing of it was in place; its staging {evidence_root / name} is removed")
        else:
            discard(staging)  # the empty folder of an unpack that completed

    return said
