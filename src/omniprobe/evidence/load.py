"""Loading evidence/: one attempt folder, then every host's attempts, every problem collected.

Layout: evidence/<host>/<attempt-id>/attempt.json plus one file per section (runs.json,
requests.json, ...). A new run adds an attempt folder beside the old ones; nothing is
overwritten. Every attempt says where it came from: transcribed from a source document,
measured by this package on a named host, or simulated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from omniprobe.atomic import is_temp_file
from omniprobe.errors import InputError, Problem
from omniprobe.evidence.files import ATTEMPT_FILE, SECTION_FILES, folded_files, folded_text, parse_file
from omniprobe.evidence.migrations import content_key, content_path
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
from omniprobe.safe_io import MissingFile, outside


@dataclass
class LoadedAttempt:
    path: Path
    meta: Attempt
    runs: list[ServeRun] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    offline: list[OfflineRun] = field(default_factory=list)
    offline_requests: list[OfflineRequest] = field(default_factory=list)
    capacity: list[ProfileSearch] = field(default_factory=list)
    capacity_trials: list[CapacityTrial] = field(default_factory=list)
    structure: list[StructureObservation] = field(default_factory=list)
    psnr: list[PsnrRow] = field(default_factory=list)
    determinism: list[DeterminismGroup] = field(default_factory=list)
    propagation: list[PropagationCheck] = field(default_factory=list)
    code_read: list[CodeLocation] = field(default_factory=list)
    baseline: Baseline | None = None
    corrections: list[Correction] = field(default_factory=list)
    figures: list[StatedFigure] = field(default_factory=list)
    environment: EnvManifest | None = None
    findings: list[Finding] = field(default_factory=list)
    upstream: UpstreamContract | None = None

    @property
    def id(self) -> str:
        return self.meta.id

    @property
    def host(self) -> str:
        return self.meta.host

    @property
    def simulated(self) -> bool:
        """Its figures come from omniprobe.sim (an emulated run of the sim server included)."""
        prov = self.meta.provenance
        return prov.kind == "simulated" or (prov.kind == "emulated" and prov.simulated_server)

    @property
    def emulated(self) -> bool:
        return self.meta.provenance.kind == "emulated"


def load_attempt(folder: Path) -> tuple[LoadedAttempt | None, list[Problem]]:
    """Load one attempt folder, collecting every problem rather than stopping at the first.
    A file symlinked from outside evidence/ is refused, not read."""
    problems: list[Problem] = []
    evidence_root = folder.parent.parent
    real_root = evidence_root.resolve()
    # A file that is no symlink lies where its folder really is: only the folder and the links
    # in it need resolving.
    for child in (folder, *sorted(folder.iterdir())):
        real = outside(child, real_root) if child is folder or child.is_symlink() else None
        if real is not None:
            problems.append(Problem(str(child), "", f"a symlink to {real}, outside "
                                                    f"{evidence_root}; evidence lives in evidence/"))
    if problems:
        return None, problems
    try:
        meta = parse_file(folder / ATTEMPT_FILE)
    except MissingFile:
        return None, [Problem(str(folder), "", f"attempt folder has no {ATTEMPT_FILE}")]
    except InputError as exc:
        return None, exc.problems
    attempt = LoadedAttempt(path=folder, meta=meta)
    if meta.id != folder.name:
        problems.append(Problem(str(folder / ATTEMPT_FILE), content_path(ATTEMPT_FILE, "$.id"),
                                f"expected the folder name {folder.name!r}, got {meta.id!r}"))
    if meta.host != folder.parent.name:
        problems.append(Problem(str(folder / ATTEMPT_FILE), content_path(ATTEMPT_FILE, "$.host"),
                                f"expected the host folder {folder.parent.name!r}, got {meta.host!r}"))
    strays = stray_files(folder, meta)
    if strays:  # read as its kind never is (a legacy file folded into a file it never holds)
        return None, problems + strays
    # A file of a format before 6 that version 6 folds into another is read into it.
    legacy = folded_files(folder)
    try:
        folded = folded_text(folder)
    except InputError as exc:
        folded = None
        problems.extend(exc.problems)
    for child in sorted({*folder.iterdir(), *([folded[0]] if folded else [])}):
        if child.name == ATTEMPT_FILE or is_temp_file(child) or child in legacy:
            continue  # a write in flight is no evidence
        if child.name not in SECTION_FILES:
            problems.append(Problem(str(child), "", "unknown evidence file; expected one of "
                                    + ", ".join(SECTION_FILES)))
            continue
        text = folded[1] if folded and child == folded[0] else None
        try:
            setattr(attempt, content_key(child.name), parse_file(child, text))
        except InputError as exc:
            problems.extend(exc.problems)
    return attempt, problems


# What an attempt omniprobe makes holds beside attempt.json, by the suffix its command gives the
# id (harness/offline/capacity.py, env/manifest.py); kinds that later commands add files to
# (quality, image-check and propagation write into probe and offline attempts) are not listed.
KIND_FILES = {"-capacity": ("capacity.json", "capacity-trials.json"),
              "-env": ("environment.json",)}


def stray_files(folder: Path, meta: Attempt) -> list[Problem]:
    """Each file of the folder its attempt's kind does not hold (a stray legacy
    profile-settings.json in a capacity attempt, which would be folded into an offline.json)."""
    if meta.provenance.kind == "transcribed":
        return []
    suffix = next((s for s in KIND_FILES if re.fullmatch(
        rf"\d{{4}}-\d\d-\d\dT\d{{6}}Z(\.\d{{3}})?-{re.escape(meta.host)}{s}", meta.id)), None)
    if suffix is None:  # an id omniprobe's commands never give (attempts.new_attempt_id)
        return []
    held = KIND_FILES[suffix]
    return [Problem(str(child), "", f"an attempt of kind {suffix[1:]!r} holds "
                                    f"{' and '.join(held)} beside {ATTEMPT_FILE}: {child.name} is "
                                    "no file of its kind; take it out of the attempt")
            for child in sorted(folder.iterdir())
            if child.name != ATTEMPT_FILE and not is_temp_file(child) and child.name not in held]


@dataclass
class Evidence:
    attempts: list[LoadedAttempt]

    def for_host(self, host: str, *, include_simulated: bool = False,
                 include_emulated: bool = False) -> list[LoadedAttempt]:
        return [a for a in self.attempts
                if a.host == host and (include_simulated or not a.simulated)
                and (include_emulated or not a.emulated)]

    def attempt(self, attempt_id: str) -> LoadedAttempt:
        for a in self.attempts:
            if a.id == attempt_id:
                return a
        raise KeyError(f"no attempt {attempt_id!r} under evidence/")


def load_evidence(root: Path) -> tuple[Evidence, list[Problem]]:
    attempts, problems = [], []
    if not root.is_dir():
        return Evidence([]), [Problem(str(root), "", "evidence folder not found")]
    for host_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for folder in sorted(p for p in host_dir.iterdir() if p.is_dir()):
            attempt, found = load_attempt(folder)
            problems.extend(found)
            if attempt is not None:
                attempts.append(attempt)
    return Evidence(attempts), problems
