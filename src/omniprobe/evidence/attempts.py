"""The attempt a probe writes: evidence/<host>/<id>/ with attempt.json, runs.json, requests.json.

Every write validates and replaces the file atomically, so a probe killed at any moment leaves
valid evidence of what it finished. Re-running resumes the host's newest probe attempt; `--fresh`
starts a new one (once per nox invocation, so several sessions given --fresh share it).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from omniprobe import __version__
from omniprobe.atomic import is_temp_file, write_text_atomic
from omniprobe.config.diffusers import profile_differences
from omniprobe.config.host_entry import Host
from omniprobe.config.project import Project
from omniprobe.digests import sha256_file
from omniprobe.errors import InputError, Problem, Refusal
from omniprobe.evidence.files import ATTEMPT_FILE, dump_json, write_section
from omniprobe.evidence.load import load_attempt
from omniprobe.evidence.models.attempt import (
    Attempt,
    AttemptEnvironment,
    Emulated,
    LaterRun,
    Measured,
    Simulated,
)
from omniprobe.evidence.models.capacity import CapacityTrial, ProfileSearch
from omniprobe.evidence.models.common import ArtifactRef, Weights, replaced
from omniprobe.evidence.models.offline import OfflineRequest, OfflineRun
from omniprobe.evidence.models.outputs import DeterminismGroup, PropagationCheck, PsnrRow
from omniprobe.evidence.models.requests import RequestRecord
from omniprobe.evidence.models.runs import ServeRun
from omniprobe.evidence.repeats import repeat_problems
from omniprobe.redaction import redact_args

R = TypeVar("R")
SUFFIX = "-probe"  # marks attempts this module made, apart from transcribed or other evidence


class AttemptBusy(Refusal):
    """Another probe holds the attempt's lock."""


class SettingsChanged(Refusal):
    """A profile resumed under settings other than those its attempt recorded."""

    @classmethod
    def of(cls, attempt: str, changes: dict[str, list[str]]) -> SettingsChanged:
        """The refusal naming, per profile, each setting that differs."""
        lines = [f"  {profile}: {change}" for profile, found in changes.items() for change in found]
        return cls(f"attempt {attempt} ran Diffusers profile(s) {', '.join(map(repr, changes))} "
                   "under other settings than it would run now:\n" + "\n".join(lines)
                   + "\nits records would mean two things: start a new attempt (--fresh), or put "
                     "the settings back")


MAX_PER_SECOND = 999


def new_attempt_id(host_name: str, now: datetime, n: int = 1, suffix: str = SUFFIX) -> str:
    """`<UTC time>-<host><suffix>`; the n-th attempt started within one second gets `.<nnn>`
    after the time, so ids sort in the order they were made: '.' sorts after '-', and the
    count has a fixed width."""
    if not 1 <= n <= MAX_PER_SECOND:
        raise ValueError(f"attempt {n} within one second: at most {MAX_PER_SECOND}")
    again = f".{n:03d}" if n > 1 else ""
    return f"{now:%Y-%m-%dT%H%M%SZ}{again}-{host_name}{suffix}"


def cap_suffix(cap_mib: int | None, suffix: str = SUFFIX) -> str:
    """The id suffix of an emulated host's attempts of one kind (probe, offline): one series of
    attempts per cap."""
    return suffix if cap_mib is None else f"-{cap_mib}mib{suffix}"


def free_attempt_id(host_dir: Path, host_name: str, now: datetime, suffix: str) -> str:
    """The first id of `new_attempt_id`'s sequence for this second with no folder yet."""
    n = 1
    while (host_dir / new_attempt_id(host_name, now, n, suffix)).exists():
        n += 1
    return new_attempt_id(host_name, now, n, suffix)


def provenance(host_name: str, host: Host, command: list[str], started_at: datetime, *,
               simulated_model: str | None = None,
               cap_mib: int | None = None) -> Measured | Simulated | Emulated:
    """Where an attempt made now comes from: measured on this machine, emulated on it at `cap_mib`
    (an emulated host), or simulated (by the sim's capacity model unless `simulated_model` says
    what else). Secrets in the command are redacted."""
    command = redact_args(command)
    if host.emulation is not None:
        if cap_mib is None:
            raise ValueError(f"host {host_name!r} is emulated: its attempts need the cap")
        return Emulated(kind="emulated", host=host_name, hostname=socket.gethostname(),
                        tool_version=__version__, command=command, started_at=started_at,
                        emulates=host.emulation.emulates, cap_mib=cap_mib,
                        physical_gpu=host.gpu, physical_compute_capability=host.compute_capability,
                        mechanism=host.emulation.mechanism, simulated_server=host.simulated)
    if host.simulated:
        model = simulated_model or f"omniprobe.sim capacity model (sim.toml [capacity.{host_name}])"
        return Simulated(kind="simulated", tool_version=__version__, command=command,
                         started_at=started_at, model=model)
    return Measured(kind="measured", host=host_name, hostname=socket.gethostname(),
                    tool_version=__version__, command=command, started_at=started_at)


def probe_attempts(host_dir: Path, cap_mib: int | None = None, kind: str = SUFFIX) -> list[Path]:
    """This host's attempt folders of one kind (probe, offline; of one cap, on an emulated
    host), oldest first (ids start with a UTC timestamp)."""
    if not host_dir.is_dir():
        return []
    suffix = cap_suffix(cap_mib, kind)
    return sorted(p for p in host_dir.iterdir()
                  if p.is_dir() and p.name.endswith(suffix) and (p / ATTEMPT_FILE).is_file())


def file_ref(path: Path, artifacts_dir: Path) -> ArtifactRef:
    return ArtifactRef(path=str(path.relative_to(artifacts_dir)), sha256=sha256_file(path),
                       bytes=path.stat().st_size)


@dataclass
class AttemptStore:
    project: Project
    folder: Path
    meta: Attempt
    runs: list[ServeRun] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    offline: list[OfflineRun] = field(default_factory=list)
    offline_requests: list[OfflineRequest] = field(default_factory=list)
    capacity: list[ProfileSearch] = field(default_factory=list)
    capacity_trials: list[CapacityTrial] = field(default_factory=list)
    created: bool = False  # a probe attempt this process made, not one it resumes
    accept_timeouts: bool = False  # this run takes a timeout as settled (--accept-timeouts)
    _lock: int | None = None
    _resumed_by: tuple[list[str], datetime, str | None, dict[str, int]] | None = None

    @property
    def artifacts(self) -> Path:
        """This attempt's folder of large files, outside git."""
        return self.project.artifacts_dir / self.meta.host / self.meta.id

    def run(self, flag_set: str) -> ServeRun | None:
        return next((r for r in self.runs if r.flag_set == flag_set), None)

    def put_run(self, run: ServeRun) -> None:
        self.runs = _put(self.folder, "runs.json", self.runs, run, lambda r: r.flag_set)

    def offline_run(self, name: str) -> OfflineRun | None:
        """The offline run of a kwarg set or profile on record."""
        return next((r for r in self.offline if r.configuration == name), None)

    def begin_offline_run(self, run: OfflineRun) -> OfflineRun:
        """An entry's run as it begins: the one on record, or `run` (an engine, its name and for
        a Diffusers profile its settings), written now where it holds settings. A profile's
        settings are recorded once: a resumed run under settings that differ from those
        recorded is refused (its records would mean two things)."""
        found = self.offline_run(run.configuration)
        if found is None and run.settings is None:
            return run  # nothing to record yet: an attempt that runs nothing stays empty
        if found is None or (found.settings is None and run.settings is not None):
            self.put_offline_run(run if found is None else replaced(found, settings=run.settings))
        elif run.settings is not None and found.settings is not None:
            changed = profile_differences(found.settings, run.settings)
            if changed:
                raise SettingsChanged.of(self.meta.id, {run.configuration: changed})
        return self.offline_run(run.configuration)

    def put_offline_run(self, run: OfflineRun) -> None:
        """An offline run, replacing its earlier state in place."""
        self.offline = _put(self.folder, "offline.json", self.offline, run,
                            lambda r: r.configuration)

    def add_offline_request(self, record: OfflineRequest) -> OfflineRequest:
        """Held as recorded only once on disk, as add_request."""
        _append(self.folder, "offline-requests.json", self.offline_requests, record)
        return record

    def put_propagation(self, checks: list[PropagationCheck]) -> None:
        """The attempt's propagation checks, all of them (each run finds them anew)."""
        write_section(self.folder, "propagation.json", checks)

    def put_quality(self, psnr: list[PsnrRow], determinism: list[DeterminismGroup]) -> list[Path]:
        """The attempt's PSNR rows and determinism groups (omniprobe quality), both validated
        before either is written."""
        texts = {"psnr.json": dump_json("psnr.json", psnr),
                 "determinism.json": dump_json("determinism.json", determinism)}
        return [write_text_atomic(self.folder / name, text) for name, text in texts.items()]

    def put_search(self, search: ProfileSearch) -> None:
        """A profile's capacity search, replacing its earlier state in place."""
        self.capacity = _put(self.folder, "capacity.json", self.capacity, search,
                             lambda s: s.profile)

    def add_trial(self, trial: CapacityTrial) -> None:
        """Write the trial, and only then hold it as recorded."""
        _append(self.folder, "capacity-trials.json", self.capacity_trials, trial)

    def add_request(self, record: RequestRecord) -> None:
        """Held as recorded only once on disk: a failed write leaves it to be sent again."""
        _append(self.folder, "requests.json", self.requests, record)

    def recorded(self, flag_set: str, fixture: str, seed: int) -> bool:
        """A record of the cell that measured something: a transport failure is sent again, and
        so is a timeout unless this run accepts timeouts."""
        return any(r.flag_set == flag_set and r.fixture == fixture and r.seed == seed
                   and r.settles(self.accept_timeouts) for r in self.requests)

    def discard_if_empty(self) -> bool:
        """Remove a probe attempt this process made that holds nothing but attempt.json (a run
        that failed early), so it never becomes the newest one a re-run resumes."""
        if not self.created or any(p.name != ATTEMPT_FILE and not is_temp_file(p)
                                   for p in self.folder.iterdir()):
            return False
        shutil.rmtree(self.folder)
        return True

    def begin_resume(self, command: list[str], environment_digest: str | None) -> None:
        """This command resumes the attempt: what it adds is recorded as it closes."""
        started = datetime.now(UTC).replace(microsecond=0)
        self._resumed_by = (redact_args(command), started, environment_digest,
                            record_counts(self.folder))

    def close(self) -> None:
        """Record the resuming command, where it added records, then let the attempt go."""
        if self._resumed_by is not None and self._lock is not None:
            command, started, digest, before = self._resumed_by
            added = {name: n - before.get(name, 0) for name, n in
                     record_counts(self.folder).items() if n > before.get(name, 0)}
            if added:
                self.meta = self.meta.model_copy(update={"later_runs": [
                    *self.meta.later_runs, LaterRun(command=command, started_at=started,
                                                    environment_digest=digest, added=added)]})
                write_section(self.folder, ATTEMPT_FILE, self.meta)
            self._resumed_by = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _take_lock(self) -> None:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.artifacts / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AttemptBusy(f"another probe is writing attempt {self.meta.id}") from None
        self._lock = fd
        # Only the lock's holder writes the folder: a temp file now was left by a killed writer.
        for stale in filter(is_temp_file, self.folder.iterdir()):
            stale.unlink(missing_ok=True)


def _put(folder: Path, file_name: str, rows: list[R], row: R, key: Callable[[R], str]
         ) -> list[R]:
    """`rows` with `row` in the place of the one of the same key (else last), written to the
    file first: a failed write leaves the store's rows as they were."""
    at = next((i for i, r in enumerate(rows) if key(r) == key(row)), None)
    new = [*rows, row] if at is None else [*rows[:at], row, *rows[at + 1:]]
    write_section(folder, file_name, new)
    return new


def _append(folder: Path, file_name: str, rows: list[R], row: R) -> None:
    """`row` written after `rows` to the file first, and only then added to them: a failed write
    leaves it unrecorded (to be run again)."""
    write_section(folder, file_name, [*rows, row])
    rows.append(row)


def orphaned_records(host_dir: Path) -> list[tuple[Path, list[str]]]:
    """The host's attempt folders that hold records but no attempt.json, with their files."""
    found = []
    for folder in sorted(host_dir.iterdir()) if host_dir.is_dir() else []:
        names = sorted(p.name for p in folder.glob("*.json")) if folder.is_dir() else []
        if names and not (folder / ATTEMPT_FILE).exists():
            found.append((folder, names))
    return found


def record_counts(folder: Path) -> dict[str, int]:
    """The records each section file of an attempt holds (its one list), by file name."""
    counts = {}
    for path in sorted(folder.glob("*.json")):
        if path.name == ATTEMPT_FILE or is_temp_file(path):
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        lists = [v for v in data.values() if isinstance(v, list)] if isinstance(data, dict) else []
        counts[path.name] = sum(len(v) for v in lists)
    return counts


def _load(project: Project, folder: Path) -> AttemptStore:
    """An attempt to resume, refused where it is damaged: a resume would append to it."""
    loaded, problems = load_attempt(folder)
    if not problems and loaded is not None:
        problems = [Problem(p.file, p.path, f"{p.message}: the attempt is damaged, and a resume "
                                            "would add to it; restore it (git checkout) or start "
                                            "a new one (--fresh)")
                    for p in repeat_problems(loaded)]
    if problems or loaded is None:
        raise InputError(problems)
    return AttemptStore(project, folder, loaded.meta, list(loaded.runs), list(loaded.requests),
                        list(loaded.offline), list(loaded.offline_requests), list(loaded.capacity),
                        list(loaded.capacity_trials))


def open_attempt(project: Project, folder: Path) -> AttemptStore:
    """An attempt on disk, to add a section to (omniprobe quality): loaded, refused where it is
    damaged, and locked against a probe writing it; close() lets it go."""
    store = _load(project, folder)
    store._take_lock()
    return store


def file_attempt(folder: Path, meta: Attempt, sections: dict[str, object]) -> Path:
    """A whole attempt made at once (an env manifest, an upstream contract): attempt.json and its
    sections written in a scratch folder and renamed into place, so no reader sees half an
    attempt and a failed write leaves nothing. A folder that exists is never replaced."""
    if folder.exists():
        raise FileExistsError(folder)
    scratch = folder.parent / f".{folder.name}.tmp"
    try:
        write_section(scratch, ATTEMPT_FILE, meta)
        for file_name, content in sections.items():
            write_section(scratch, file_name, content)
        os.rename(scratch, folder)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def _create(project: Project, host_name: str, host: Host, command: list[str],
            suffix: str = SUFFIX, what: str = "probe-init / probe-serve",
            cap_mib: int | None = None,
            environment: AttemptEnvironment | None = None,
            weights: Weights | None = None) -> AttemptStore:
    now = datetime.now(UTC).replace(microsecond=0)
    attempt_id = free_attempt_id(project.evidence_dir / host_name, host_name, now, suffix)
    folder = project.evidence_dir / host_name / attempt_id
    meta = Attempt(id=attempt_id, host=host_name, date=now.date().isoformat(),
                   description=f"{what} by omniprobe {__version__} on "
                               f"{host.name}" + (" (simulated)" if host.simulated else "")
                               + (f", capped at {cap_mib:,} MiB" if cap_mib else "")
                               + (", random weights (capacity only)" if weights == "random"
                                  else ""),
                   provenance=provenance(host_name, host, command, now, cap_mib=cap_mib),
                   environment=environment, weights=weights)
    folder.mkdir(parents=True, exist_ok=False)
    write_section(folder, ATTEMPT_FILE, meta)
    return AttemptStore(project, folder, meta)


def new_attempt(project: Project, host_name: str, host: Host, command: list[str], *,
                suffix: str, what: str,
                environment: AttemptEnvironment | None = None) -> AttemptStore:
    """A new attempt of another session (e.g. `-offline`); its suffix keeps probe-init and
    probe-serve from resuming it."""
    if suffix == SUFFIX:
        raise ValueError(f"{SUFFIX!r} is the suffix of probe-init / probe-serve attempts")
    if host.emulation is not None:
        raise Refusal(f"host {host_name!r} is emulated: {what} does not cap its processes at the "
                      "emulated capacity; only probe-init and probe-serve run on an emulated host")
    store = _create(project, host_name, host, command, suffix, what, environment=environment)
    store._take_lock()
    return store


def resume_decision(newest: Attempt | None, environment: AttemptEnvironment, *,
                    complete: bool) -> tuple[bool, str]:
    """Whether to resume the host's newest probe attempt in `environment`, and why (or why a new
    one starts): only an attempt made by this omniprobe version in the same environment, serving
    the same model, resumes; a complete one is resumed only to say so."""
    if newest is None:
        return False, "new: no earlier probe attempt of this host"
    made = newest.provenance
    if made.kind == "transcribed":
        return False, f"new: {newest.id} is transcribed, never resumed"
    if newest.environment is None:
        return False, f"new: {newest.id} does not record its environment (made before attempts did)"
    if made.tool_version != __version__:
        return False, (f"new: {newest.id} was made by omniprobe {made.tool_version}, this is "
                       f"{__version__}")
    if newest.environment.digest != environment.digest:
        return False, (f"new: {newest.id} ran in another environment (env digest "
                       f"{newest.environment.digest[:12]}, this one {environment.digest[:12]})")
    if newest.environment.served != environment.served:
        return False, (f"new: {newest.id} served another model ({newest.environment.served.model}, "
                       f"this one {environment.served.model})")
    if newest.environment.host_ram_cap_mib != environment.host_ram_cap_mib:
        held = lambda mib: "not capped" if mib is None else f"capped at {mib:,} MiB"  # noqa: E731
        return False, (f"new: {newest.id} ran with host RAM "
                       f"{held(newest.environment.host_ram_cap_mib)}, this one "
                       f"{held(environment.host_ram_cap_mib)}")
    if complete:
        return True, f"complete: {newest.id} holds every cell asked for"
    return True, f"resumed: {newest.id} is incomplete, made in this environment"


def open_probe_attempt(project: Project, host_name: str, host: Host, command: list[str], *,
                       environment: AttemptEnvironment, fresh: bool, fresh_id: str | None,
                       complete: Callable[[AttemptStore], bool],
                       cap_mib: int | None = None, kind: str = SUFFIX,
                       what: str = "probe-init / probe-serve",
                       weights: Weights | None = None) -> tuple[AttemptStore, str]:
    """The attempt of one kind (probe, offline) to write, and why: this nox run's fresh one, a
    new one (--fresh, or the newest cannot be resumed: resume_decision says why), or the newest
    to resume (on an emulated host, of the same cap)."""
    host_dir = project.evidence_dir / host_name
    orphaned = orphaned_records(host_dir)
    if orphaned:
        raise InputError([Problem(str(folder / ATTEMPT_FILE), "", "missing, while the folder "
                                  f"holds records ({', '.join(names)}): restore attempt.json (git "
                                  "checkout), or move the folder out of evidence/; no attempt "
                                  "starts beside it") for folder, names in orphaned])
    if fresh_id and (host_dir / fresh_id).is_dir():
        store, why = _load(project, host_dir / fresh_id), f"joined: {fresh_id}, this nox run's --fresh one"
    elif fresh:
        store, why = None, "new: --fresh"
    else:
        existing = probe_attempts(host_dir, cap_mib, kind)
        newest = _load(project, existing[-1]) if existing else None
        resume, why = resume_decision(newest.meta if newest else None, environment,
                                      complete=newest is not None and complete(newest))
        store = newest if resume else None
    if store is None:
        store = _create(project, host_name, host, command, cap_suffix(cap_mib, kind), what,
                        cap_mib=cap_mib, environment=environment, weights=weights)
        store.created = True  # removed again if its run records nothing
    store._take_lock()
    if not store.created and not (fresh_id and store.meta.id == fresh_id):
        store.begin_resume(command, environment.digest)
    return store, why
