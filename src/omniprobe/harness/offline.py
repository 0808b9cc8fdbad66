"""probe-offline: generate the fixtures with an offline engine per entry of the host's offline
matrix: vLLM-Omni's `Omni(...)` per offline kwarg set, or on a Diffusers host the Diffusers
pipeline per Diffusers profile.

Each entry runs the runner script (omniprobe/harness/offline_runner.py) with the host's pinned venv
python (or the host's offline_command), in its own process group under omniprobe.harness.supervise,
like the server, sampled like the server (its process tree's GPU memory, a timeline per runner) and,
on an emulated host, capped like it (the startup hook, `--caps` to sweep, the tree guard). The
runner writes one JSON line per request; the one recorder makes each an OfflineRequest in
offline-requests.json (OOM parsed from the exception's text, the image measured and gated as
serve's are, random weights never gated), and each entry and fixture an OfflineRun in offline.json.
A kwarg set that is another's plus one setting gets a propagation check against it
(propagation.json), as serve's deploy configs do. A failed request ends an Omni runner (upstream's
engine closes on one) and the rest get a fresh runner; a Diffusers pipeline survives it. Only a
lost runner counts as a restart. A re-run resumes the host's newest offline attempt (of the cap)
made in the same environment serving the same model, as probe-serve does (`--fresh`: a new one).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from omniprobe.analysis.failure_cause import classify_failure
from omniprobe.analysis.oom import is_oom, parse_oom
from omniprobe.analysis.summaries import cell_outcome, cell_quality
from omniprobe.atomic import write_text_atomic
from omniprobe.config.fixtures import Fixture, FixtureSuite
from omniprobe.config.host_entry import Host
from omniprobe.config.hosts import HostsConfig, load_hosts
from omniprobe.config.project import Project
from omniprobe.config.selection import resolve_host, session_venv
from omniprobe.digests import sha256_json
from omniprobe.env.allocator import read_back
from omniprobe.env.checks import Verification, require_env_ok
from omniprobe.env.fetch_model import hf_cache_dir
from omniprobe.env.manifest import env_digest, manifest_of
from omniprobe.env.simulated import sim_env_digest
from omniprobe.env.snapshot import pinned_snapshot
from omniprobe.env.state import EnvName, Runner
from omniprobe.errors import EnvironmentFailure, HarnessError, Refusal
from omniprobe.evidence.attempts import AttemptStore, file_ref, open_probe_attempt
from omniprobe.evidence.files import write_section
from omniprobe.evidence.models.attempt import AttemptEnvironment, ServedModel
from omniprobe.evidence.models.common import ArtifactRef, FailureCause
from omniprobe.evidence.models.offline import DiffusersBuild, HostRamCheck, OfflineRequest, OfflineRun
from omniprobe.evidence.models.runs import TimelineSummary
from omniprobe.evidence.quantities import Range
from omniprobe.harness.client import check_references, reference_path
from omniprobe.harness.emulation import (
    EmulationGuard,
    EmulationUnguarded,
    capped_processes,
    emulation_env,
)
from omniprobe.harness.host_memory import oom_kill_count
from omniprobe.harness.host_ram_cap import HostRamCap, require_host_ram_cap
from omniprobe.harness.interrupt import pause
from omniprobe.harness.logs import log_tail, read_from
from omniprobe.harness.offline_matrix import OfflineEntry, offline_matrix, runner_facts
from omniprobe.harness.options import OfflineOptions, settings_of
from omniprobe.harness.plan import settled_line
from omniprobe.harness.probe import (
    MEMORY_FILE,
    PlanError,
    ReaderFactory,
    SamplerDied,
    default_readers,
    host_ram_failure,
    open_run_attempt,
    prepare_env,
    probe_caps,
    serve_fixtures,
    timeline_summary,
)
from omniprobe.harness.progress import Progress
from omniprobe.harness.propagation import describe, offline_checks, unchecked_extras
from omniprobe.harness.recorder import record_request
from omniprobe.harness.sampler import MIB, GpuReader, NvmlUnavailable, Sampler, wait_idle
from omniprobe.harness.server import ServerProcess, classify_exit, no_space_cause
from omniprobe.harness.session import Context, Session, run_session
from omniprobe.redaction import redact_file, redact_text
from omniprobe.safe_io import json_loads

RUNNER = Path(__file__).with_name("offline_runner.py")
ATTEMPT_SUFFIX = "-offline"
_PLACEHOLDER = re.compile(r"\{(python|runner|hosts_file|host)\}")


class KwargSetNotRunnable(PlanError):
    """An offline kwarg set (or profile) the host does not run, or whose kwargs the source does
    not state."""


class RunnerProtocolError(HarnessError):
    """The runner wrote something the protocol does not allow."""


@dataclass(frozen=True)
class OfflineSettings:
    """What probe-offline runs with: the command line's options over hosts.toml's defaults."""

    model: str
    ready_timeout_s: float
    request_timeout_s: float
    grace_s: float
    idle_timeout_s: float = 60.0
    poll_s: float = 0.02  # the runner's results file: a read of what it appended, if anything
    kwarg_sets: tuple[str, ...] = ()
    fixtures: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()
    max_restarts: int = 2
    sample_hz: float = 10.0
    cap_mib: int | None = None  # an emulated host's cap for this attempt
    gpu_index: int = 0  # NVML's index: the runner's device (CUDA_VISIBLE_DEVICES), as sampled
    host_ram_mib: int | None = None  # an emulated host's host RAM, capped by a cgroup


@dataclass(frozen=True)
class Planned:
    fixture: Fixture
    seed: int

    @property
    def id(self) -> str:
        return f"{self.fixture.id}-{self.seed}"


@dataclass(frozen=True)
class RunnerCommand:
    """How the offline runner is started, and the built env whose Python runs it (None: the
    Python running omniprobe)."""

    argv: list[str]
    env: EnvName | None = None
    verification: Verification | None = None


def runner_env_name(host: Host) -> EnvName | None:
    """The built env a host's offline runner runs in: the baseline env for a Diffusers host whose
    runner_env says so, the probe env where no offline_command is given, else None."""
    if host.diffusers is not None and host.diffusers.runner_env == "baseline":
        return "baseline"
    return None if host.offline_command else "probe"


def runner_command(cfg: HostsConfig, project: Project, host_name: str,
                   venv: str | None = None, *, nvml=None, out: TextIO | None = None
                   ) -> RunnerCommand:
    """The host's offline_command (default: {python} {runner}), {python} being the Python of the
    env the runner runs in (runner_env_name) or the one running omniprobe; refuses a built env
    that fails any check (EnvNotReady names each and the command that builds it), as the probe
    sessions do, and warns on `out` of each upstream contract check its clone fails."""
    host = cfg.host(host_name)
    which, verification, python = runner_env_name(host), None, sys.executable
    if which is not None:
        # The env session's venv is the probe env's; the baseline env lies at its own folder.
        venv = (session_venv(project, host_name) or venv) if which == "probe" else None
        verification = require_env_ok(host_name, project=project, venv=venv, nvml=nvml, out=out,
                                      which=which)
        python = str(verification.paths.python)
    fill = {"python": python, "runner": str(RUNNER), "hosts_file": str(project.hosts_file),
            "host": host_name}
    argv = [_PLACEHOLDER.sub(lambda m: fill[m[1]], part)
            for part in host.offline_command or ["{python}", "{runner}"]]
    return RunnerCommand(argv, which, verification)


def runner_env(cfg: HostsConfig, entry: OfflineEntry, base: dict[str, str],
               allocator_variable: str | None = None) -> dict[str, str]:
    """Ours, the stack's offline variables, the entry's, and CUDA numbering GPUs as NVML."""
    return {**base, **cfg.stack.offline_env, **entry.runner_env(allocator_variable),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


class Events:
    """The runner's results file, read as it grows; a line counts once it is complete."""

    def __init__(self, path: Path):
        self.path, self._offset, self._partial = path, 0, b""
        self._queue: list[dict] = []

    def next(self) -> dict | None:
        if not self._queue:
            self._read()
        return self._queue.pop(0) if self._queue else None

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in filter(bytes.strip, lines):
            try:
                event = json_loads(line)
            except ValueError:
                raise RunnerProtocolError(f"{self.path}: not a JSON line: {line[:200]!r}") from None
            if not isinstance(event, dict) or "event" not in event:
                raise RunnerProtocolError(f"{self.path}: a result without 'event': {line[:200]!r}")
            self._queue.append(event)


@dataclass
class EntryState:
    """What one entry's runner processes produced, for its offline.json rows (a resumed attempt's
    earlier rows included)."""

    init_s: float | None = None
    failure: OfflineRun | None = None
    logs: list[ArtifactRef] = field(default_factory=list)
    timelines: list[TimelineSummary] = field(default_factory=list)
    build: DiffusersBuild | None = None
    survives_failure: bool = False
    host_ram: list[HostRamCheck] = field(default_factory=list)

    @classmethod
    def resumed(cls, rows: list[OfflineRun]) -> EntryState:
        """What a resumed attempt's rows of the entry hold (a fixture's row, where there is one:
        an init failure's row is superseded by a fresh build)."""
        row = next((r for r in rows if r.fixture is not None), rows[0] if rows else None)
        if row is None:
            return cls()
        return cls(init_s=row.init_s, logs=list(row.logs), timelines=list(row.timelines),
                   build=row.build, host_ram=list(row.host_ram))


def init_settled(rows: list[OfflineRun]) -> bool:
    """Whether an entry's failed init is on record for good: one the environment failed
    measured nothing about the card, so a re-run builds that engine again."""
    failed = [r for r in rows if r.outcome in ("init-oom", "init-error", "timeout")
              and r.fixture is None]
    return bool(failed) and (failed[-1].cause is None or failed[-1].cause.kind != "environment")


class OfflineProbe:
    def __init__(self, cfg: HostsConfig, suite: FixtureSuite, fixtures_dir: Path, host_name: str,
                 store: AttemptStore, settings: OfflineSettings, command: list[str], *,
                 readers: ReaderFactory, base_env: dict[str, str] | None = None,
                 out: TextIO = sys.stderr):
        self.cfg, self.suite, self.fixtures_dir = cfg, suite, fixtures_dir
        self.host_name, self.host = host_name, cfg.host(host_name)
        self.store, self.settings, self.command = store, settings, command
        self.readers, self.out = readers, out
        self.model_code = tuple(self.host.model_code)
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.baseline: int | None = None
        self.records: list[OfflineRequest] = list(store.offline_requests)
        self.runs: list[OfflineRun] = list(store.offline)
        self.unfinished: list[str] = []
        self.environment_failures: list[str] = []

    def run(self, entries: list[OfflineEntry], plans: dict[str, list[Planned]]) -> None:
        todo = {e.name: self._pending(e.name, plans[e.name]) for e in entries}
        total = sum(len(p) for p in todo.values())
        asked = sum(len(p) for p in plans.values())
        progress = Progress(total, self.out)
        progress.say(f"probe-offline on {self.host_name}: {asked} request(s) over "
                     f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, "
                     f"{asked - total} recorded, {total} to run; attempt {self.store.meta.id}"
                     + (f", capped at {self.settings.cap_mib:,} MiB" if self.settings.cap_mib
                        else ""))
        for number, entry in enumerate(entries, 1):
            rows = [r for r in self.runs if r.kwarg_set == entry.name]
            if init_settled(rows):
                progress.say(f"[{entry.name}] skipped: its init "
                             f"{next(r.outcome for r in rows if r.fixture is None)} is recorded")
                continue
            if todo[entry.name]:
                self._entry(f"{entry.name} {number}/{len(entries)}", entry, todo[entry.name],
                            progress, rows)

    def _pending(self, name: str, plan: list[Planned]) -> list[Planned]:
        done = {(r.fixture, r.seed) for r in self.records if r.kwarg_set == name}
        return [p for p in plan if (p.fixture.id, p.seed) not in done]

    # --- one entry --------------------------------------------------------------------------

    def _entry(self, label: str, entry: OfflineEntry, pending: list[Planned],
               progress: Progress, rows: list[OfflineRun]) -> None:
        state = EntryState.resumed(rows)
        restarts, first = 0, len(state.logs)  # a resume numbers its runners after the earlier ones
        for index in itertools.count(first):
            pending, closed = self._lifetime(label, entry, index, pending, state, progress)
            if not pending:
                break
            if state.failure is not None:
                if index > first:  # a restart failed to build: the rest never ran
                    self.unfinished.append(f"{entry.name}: {len(pending)} request(s) not run, "
                                           f"the restarted runner's init ended "
                                           f"{state.failure.outcome}")
                elif state.failure.cause is not None and state.failure.cause.kind == "environment":
                    self.environment_failures.append(
                        f"{entry.name}: init {state.failure.outcome}: {state.failure.cause.reason}")
                break
            if closed:
                continue  # the engine closed on a failed request, as upstream's does: planned
            if restarts >= self.settings.max_restarts:
                self.unfinished.append(f"{entry.name}: {len(pending)} request(s) not run after "
                                       f"{restarts} restart(s); re-run to try them again")
                break
            restarts += 1
        self.runs = [r for r in self.runs if r.kwarg_set != entry.name] + self._summary(entry.name,
                                                                                        state)
        write_section(self.store.folder, "offline.json", self.runs)

    def _summary(self, name: str, state: EntryState) -> list[OfflineRun]:
        """The init failure, if any, then one row per fixture in the order they ran."""
        shared = {"logs": list(state.logs), "timelines": list(state.timelines),
                  "build": state.build, "host_ram": list(state.host_ram)}
        rows = [state.failure.model_copy(update=shared)] if state.failure else []
        records = [r for r in self.records if r.kwarg_set == name]
        for fixture in dict.fromkeys(r.fixture for r in records):
            mine = [r for r in records if r.fixture == fixture]
            walls = [r.wall_s for r in mine if r.outcome == "ok"]
            rows.append(OfflineRun(
                kwarg_set=name, fixture=fixture, seeds=sorted({r.seed for r in mine}),
                outcome=cell_outcome([r.outcome for r in mine]), quality=cell_quality(mine),
                oom=next((r.oom for r in mine if r.oom is not None), None),
                wall_s=Range.of(walls) if walls else None, init_s=state.init_s, **shared))
        return rows

    # --- one runner process -----------------------------------------------------------------

    def _write_inputs(self, entry: OfflineEntry, folder: Path, pending: list[Planned]) -> list[str]:
        images = self.store.artifacts / entry.name / "images"
        images.mkdir(parents=True, exist_ok=True)
        steps, guidance, _ = entry.sampling(self.suite.sampling)
        requests = [{
            "id": p.id, "fixture": p.fixture.id, "seed": p.seed, "prompt": p.fixture.prompt,
            "width": p.fixture.width, "height": p.fixture.height,
            "references": [str(reference_path(p.fixture, r, self.fixtures_dir))
                           for r in p.fixture.references or []],
            "num_inference_steps": steps, "true_cfg_scale": guidance,
            "output": str(images / f"{p.id}.png"),
        } for p in pending]
        write_text_atomic(folder / "kwargs.json", json.dumps(entry.kwargs, indent=2) + "\n")
        write_text_atomic(folder / "requests.json", json.dumps({"requests": requests}, indent=2))
        engine = [] if entry.engine == "omni" else ["--engine", entry.engine]
        return [*engine, "--model", self.settings.model,
                "--kwargs-file", str(folder / "kwargs.json"),
                "--requests", str(folder / "requests.json"),
                "--results", str(folder / "results.jsonl")]

    def _reader(self, folder: Path) -> tuple[GpuReader | None, str | None]:
        try:
            return self.readers(folder), None
        except NvmlUnavailable as exc:
            return None, str(exc)

    def _lifetime(self, label: str, entry: OfflineEntry, index: int, pending: list[Planned],
                  state: EntryState, progress: Progress) -> tuple[list[Planned], bool]:
        """One runner process over the pending requests; returns those it did not get to, and
        whether it ended because a request failed (upstream's engine closes then: the runner
        ends by plan, not by a fault)."""
        name = entry.name
        folder = self.store.artifacts / name / f"runner-{index + 1}"
        folder.mkdir(parents=True, exist_ok=True)
        args = self._write_inputs(entry, folder, pending)
        reader, reason = self._reader(folder)
        cap = self.settings.cap_mib
        if cap is not None and reader is None:
            raise EmulationUnguarded(f"host {self.host_name!r} is emulated, but its runner's "
                                     f"memory cannot be sampled to check the cap: {reason}")
        if reader is not None:
            self.baseline = wait_idle(reader, self.baseline,
                                      timeout_s=self.settings.idle_timeout_s,
                                      tolerance_mib=self.host.idle_tolerance_mib, poll_s=0.25)
        env = runner_env(self.cfg, entry, self.base_env,
                         self.store.meta.environment.allocator_variable
                         if self.store.meta.environment else None)
        if self.host.offline_command is None:
            # The pinned venv sees its own packages only, not whatever our environment adds.
            env.pop("PYTHONPATH", None)
            env.pop("PYTHONHOME", None)
        if self.host.memory_file_env:
            env[self.host.memory_file_env] = str(folder / MEMORY_FILE)
        env["CUDA_VISIBLE_DEVICES"] = str(self.settings.gpu_index)  # the sampled device
        guard = None
        if cap is not None:
            env.update(emulation_env(self.host, cap, env))
            guard = EmulationGuard(cap, None if self.baseline is None else self.baseline / MIB)
        command = [*self.command, *args]
        ram = None
        if self.settings.host_ram_mib is not None:
            ram = HostRamCap.create(f"omniprobe-{self.store.meta.id}-{name}-{index + 1}",
                                    self.settings.host_ram_mib)
            command = ram.wrap(command, sys.executable)
        runner = ServerProcess(command, env, folder / "runner.log", None,
                               grace_s=self.settings.grace_s, model_code=self.model_code)
        events = Events(folder / "results.jsonl")
        progress.say(f"[{label}] starting the runner")
        # An emulated host RAM cap's cgroup is no descendant of ours: its own count tells, and a
        # cgroup made a moment ago has killed nothing yet.
        count = ram.oom_kills if ram is not None else oom_kill_count
        oom_kills = 0 if ram is not None else count()
        runner.start()
        sampler = None
        try:
            if reader is not None:
                sampler = Sampler(reader, folder / "timeline.jsonl", hz=self.settings.sample_hz,
                                  root_pid=lambda: runner.pid, t0=runner.started, guard=guard)
                sampler.start()
            host_ram = functools.partial(host_ram_failure, sampler, oom_kills, count=count)
            if not self._init(label, entry, runner, events, state, progress, host_ram):
                return pending, False
            while pending:
                planned = pending[0]
                waited_from = time.monotonic()
                event, why = self._next(runner, events, self.settings.request_timeout_s)
                if event is not None:
                    _check_result(event, planned, events.path)
                breach = (guard.breach_by(time.monotonic() - runner.started)
                          if guard is not None else None)
                record = (self._record(entry, planned, event, index, breach)
                          if event is not None else
                          self._lost(entry, planned, index, why, runner.log_path,
                                     time.monotonic() - waited_from, breach,
                                     functools.partial(host_ram, runner.returncode())))
                pending.pop(0)
                progress.step(f"[{label}] {planned.fixture.id} seed {planned.seed}: "
                              f"{record.outcome} {record.wall_s:.2f} s"
                              + (f", output {record.quality}" if record.outcome == "ok" else "")
                              + (f", peak {record.peak_mib:,.0f} MiB" if record.peak_mib else "")
                              + (f" (tried to allocate {record.oom.requested})"
                                 if record.oom and record.oom.requested else "")
                              + ("" if event is not None else " (runner lost: restarting)"))
                if event is None:
                    return pending, False
                if event["outcome"] != "ok" and not state.survives_failure:
                    runner.wait_exit(self.settings.grace_s)
                    if pending:
                        progress.say(f"[{label}] the engine closed on the failed request: a "
                                     f"fresh runner for the {len(pending)} left")
                    return pending, True
            runner.wait_exit(self.settings.grace_s)  # let the engine shut down on its own
            return pending, False
        finally:
            runner.stop()
            timeline = timeline_summary(sampler, reason, self.settings.sample_hz,
                                        self.store.project.artifacts_dir)
            if guard is not None:
                capped = capped_processes(read_from(runner.log_path))
                timeline = timeline.model_copy(update={"emulation": guard.check(capped)})
            state.timelines.append(timeline)
            if ram is not None:
                state.host_ram.append(ram.check())
                ram.remove()
            redact_file(runner.log_path)
            state.logs.append(file_ref(runner.log_path, self.store.project.artifacts_dir))
            if timeline.state == "incomplete" and sys.exc_info()[0] is None:
                # Recorded first; only a lifetime that ended on its own fails for it (another
                # exception in flight says more).
                raise SamplerDied(f"[{entry.name}] {timeline.reason}; the timeline of runner "
                                  f"{index} is recorded as incomplete (re-run to resume)")

    def _next(self, runner: ServerProcess, events: Events,
              timeout_s: float) -> tuple[dict | None, str | None]:
        """The next result, or None and why not ('timeout' or 'exited N')."""
        deadline = time.monotonic() + timeout_s
        while True:
            event = events.next()
            if event is not None:
                return event, None
            code = runner.returncode()
            if code is not None:
                event = events.next()  # a last line written just before it exited
                return (event, None) if event is not None else (None, f"exited {code}")
            if time.monotonic() >= deadline:
                return None, "timeout"
            pause(self.settings.poll_s)

    def _init(self, label: str, entry: OfflineEntry, runner: ServerProcess, events: Events,
              state: EntryState, progress: Progress,
              host_ram: Callable[[int | None, str], FailureCause | None]) -> bool:
        """Wait for the engine; on failure set state.failure and return False. `host_ram`:
        (exit status, log) -> the host's cause of a runner the kernel killed for host RAM."""
        name = entry.name
        event, why = self._next(runner, events, self.settings.ready_timeout_s)
        elapsed = round(time.monotonic() - runner.started, 2)
        if event is not None and event["event"] != "init":
            raise RunnerProtocolError(f"{events.path}: expected the init result, got {event}")
        if event is not None and event.get("outcome") == "ready":
            refused = self._refuse_ready(entry, event)
            if refused is None:
                if state.init_s is None:
                    state.init_s = event.get("wall_s")
                state.survives_failure = bool(event.get("survives_failure"))
                if event.get("facts"):
                    state.build = DiffusersBuild.model_validate(event["facts"])
                progress.say(f"[{label}] engine built after {event.get('wall_s')} s")
                return True
            failure = OfflineRun(kwarg_set=name, outcome="init-error", quality="unchecked",
                                 init_s=event.get("wall_s"), note=refused.reason, cause=refused)
        elif event is not None:
            text = event.get("traceback") or event.get("error") or ""
            if not is_oom(text):
                # Upstream reports a worker's death as "Orchestrator initialization failed";
                # the CUDA OOM text is only in the worker's log, which is the runner's log.
                text = read_from(runner.log_path)
            oom = (parse_oom(text, "init", self.model_code)
                   if event.get("outcome") == "oom" or is_oom(text) else None)
            failure = OfflineRun(kwarg_set=name, outcome="init-oom" if oom else "init-error",
                                 quality="unchecked", oom=oom, init_s=event.get("wall_s"),
                                 note=redact_text(event.get("error") or "")[:500] or None,
                                 cause=classify_failure(text, self.model_code))
        elif why == "timeout":
            failure = OfflineRun(kwarg_set=name, outcome="timeout", quality="unchecked",
                                 note=f"the engine was not built within "
                                      f"{self.settings.ready_timeout_s:g} s")
        else:
            code = runner.returncode()
            log = read_from(runner.log_path)
            init = classify_exit(code if code is not None else -1, log, elapsed, self.model_code)
            # The kernel may have killed it for host RAM: the host's answer.
            cause = host_ram(code, log) or init.cause or no_space_cause(runner.log_path.parent)
            failure = OfflineRun(kwarg_set=name, quality="unchecked", oom=init.oom,
                                 outcome="init-oom" if init.outcome == "oom" else "init-error",
                                 note=init.note, cause=cause)
        state.failure = failure
        progress.say(f"[{label}] the engine was not built: {failure.outcome}"
                     + (f" ({failure.note})" if failure.note else ""))
        return False

    def _refuse_ready(self, entry: OfflineEntry, event: dict) -> FailureCause | None:
        """A built engine that cannot be measured honestly: uncapped on an emulated host, an
        allocator setting its torch ignored, or a component of the wrong size."""
        emulation = event.get("emulation")
        if self.settings.cap_mib is not None and not (emulation and emulation.get("hook_loaded")):
            return FailureCause(kind="environment", reason="the emulation hook did not load in "
                                                           "the runner: it ran uncapped")
        facts = event.get("facts") or {}
        profile = entry.kwargs.get("profile") or {}
        wants_expandable = "expandable_segments:True" in (profile.get("allocator") or "")
        if wants_expandable and facts.get("expandable_segments") is False:
            return FailureCause(kind="environment", reason=(
                f"the profile sets {profile.get('allocator')!r} in {sorted(entry.env)}, but the "
                "allocator reads back without expandable segments"))
        for component, (billions, tolerance) in entry.expected_parameters.items():
            built = (facts.get("parameters_b") or {}).get(component)
            if built is None or abs(built - billions) > tolerance * billions:
                return FailureCause(kind="environment", reason=(
                    f"the built {component} has {built} B parameters; its config expects "
                    f"{billions} B within {tolerance:.0%}"))
        return None

    # --- records ----------------------------------------------------------------------------

    def _add(self, record: OfflineRequest) -> OfflineRequest:
        """Write the record, and only then hold it as recorded."""
        write_section(self.store.folder, "offline-requests.json", [*self.records, record])
        self.records.append(record)
        return record

    def _fields(self, entry: OfflineEntry, planned: Planned, index: int, breach) -> dict:
        steps, guidance, whose = entry.sampling(self.suite.sampling)
        return {"kwarg_set": entry.name, "fixture": planned.fixture.id,
                "inputs": planned.fixture.inputs, "seed": planned.seed, "quality": "unchecked",
                "lifetime": index, "emulation_breach": breach,
                "engine": None if entry.engine == "omni" else entry.engine,
                "weights": entry.weights, "num_inference_steps": steps,
                "true_cfg_scale": guidance, "sampling_from": whose}

    def _record(self, entry: OfflineEntry, planned: Planned, event: dict, index: int,
                breach) -> OfflineRequest:
        measured = event.get("measured") or {}
        fields = {**self._fields(entry, planned, index, breach),
                  "outcome": event.get("outcome"), "wall_s": event.get("wall_s"),
                  "peak_mib": event.get("peak_mib"), "peak_source": event.get("peak_source"),
                  "started_s": event.get("started_s"),
                  **{k: v for k, v in measured.items() if k in _MEASURED}}
        image = None
        path = self.store.artifacts / entry.name / "images" / f"{planned.id}.png"
        if event.get("outcome") == "ok":
            try:
                image = path.read_bytes()
            except OSError as exc:
                fields.update(outcome="error", error=f"the runner's image is unreadable: {exc}")
        else:
            text = event.get("traceback") or event.get("error") or ""
            if event.get("outcome") == "oom" or is_oom(text):
                fields.update(outcome="oom", oom=parse_oom(text, "request", self.model_code))
            fields["error"] = redact_text((event.get("error") or "no message")[:500])
            fields["cause"] = classify_failure(text, self.model_code)
        return self._add(record_request(
            OfflineRequest, fields, image, path, artifacts_dir=self.store.project.artifacts_dir,
            checks=self.cfg.quality, save=False, unreadable="the runner's image is unreadable"))

    def _lost(self, entry: OfflineEntry, planned: Planned, index: int, why: str | None,
              log_path: Path, waited_s: float, breach,
              host_ram: Callable[[str], FailureCause | None]) -> OfflineRequest:
        """A request the runner never answered: it hung (timeout) or died; `host_ram` reads a
        death of host RAM off its log and the signs it left (probe.host_ram_failure)."""
        fields = {**self._fields(entry, planned, index, breach), "wall_s": round(waited_s, 4)}
        if why == "timeout":
            fields.update(outcome="timeout",
                          error=f"no result within {self.settings.request_timeout_s:g} s")
            return self._add(OfflineRequest.model_validate(fields))
        log = _after_last_event(read_from(log_path))
        oom = parse_oom(log, "request", self.model_code)
        fields.update(outcome="oom" if oom else "error", oom=oom,
                      cause=host_ram(log) or classify_failure(log, self.model_code),
                      error=redact_text(f"the runner {why} during the request; its log ends: "
                                        f"{log_tail(log)}"))
        return self._add(OfflineRequest.model_validate(fields))


# What a runner's request result may carry beyond the protocol's own fields.
_MEASURED = ("peak_allocated_mib", "start_allocated_mib", "kv_cache_bytes", "kv_cache_layers",
             "kv_cache_layers_total", "prefix_tokens", "max_rss_mib")


def _check_result(event: dict, planned: Planned, path: Path) -> None:
    """A request result as the protocol has it, for the request expected next."""
    wall = event.get("wall_s")
    if (event["event"] != "request" or event.get("id") != planned.id
            or event.get("outcome") not in ("ok", "oom", "error")
            or not isinstance(wall, int | float) or wall < 0):
        raise RunnerProtocolError(f"{path}: expected the result of {planned.id!r} with outcome "
                                  f"ok, oom or error and a wall_s, got {event}")


def _after_last_event(log: str) -> str:
    """The log after the runner's last echoed result line: what the lost request left there."""
    at = log.rfind('{"event": ')
    return log if at < 0 else log[at:].partition("\n")[2]


def settings_from(options: OfflineOptions, cfg: HostsConfig, cap_mib: int | None = None,
                  host_name: str | None = None) -> OfflineSettings:
    return settings_of(OfflineSettings, options, cfg, cap_mib=cap_mib,
                       host_ram_mib=host_ram_mib(cfg.hosts.get(host_name)) if host_name else None)


def host_ram_mib(host: Host | None) -> int | None:
    ram = host.emulation.host_ram_gib if host is not None and host.emulation else None
    return None if ram is None else round(ram * 1024)


class AllocatorUnknown(EnvironmentFailure):
    """The runner's torch does not read an allocator setting back: a profile that sets one could
    measure the plain configuration."""


def offline_environment(ctx: Context, options: OfflineOptions, runner: RunnerCommand,
                        configs, entries: list[OfflineEntry], *, host_ram_mib: int | None = None,
                        nvml=None) -> tuple[AttemptEnvironment, dict]:
    """The environment an offline attempt runs in and the model its runner is given, recorded so
    a resume continues only in the same one; and the runner's facts (empty unless it runs on the
    machine's own Python)."""
    host, command = ctx.host, runner.argv
    if host.simulated:
        served = ServedModel(model=redact_text(options.model) if options.model
                             else ctx.cfg.stack.model_repo,
                             source="by_hand" if options.model else "simulated")
        return AttemptEnvironment(digest=sim_env_digest(), served=served), {}
    if runner.env == "probe":  # a real host's pinned venv: the probe's own check
        env = prepare_env(ctx.project, ctx.cfg, ctx.host_name, by_hand=options.model,
                          venv=options.venv, nvml=nvml, out=ctx.out)
        return env.record, {}
    if runner.verification is None:  # the machine's own Python: what it runs on, as it says
        facts = runner_facts(command, dict(os.environ))
        packages, manifest = facts["packages"], None
        digest = sha256_json({"python": facts.get("python"), "packages": packages,
                              "runner": command})
    else:  # the baseline env: its verified pins and checks, as the probe env's record has them
        v, facts, packages = runner.verification, {}, {}
        digest = env_digest(v.pins, v.checks, str(v.paths.venv))
        manifest = manifest_of(ctx.project.evidence_dir, ctx.host_name, digest, runner.env)
    if configs is not None:
        served = ServedModel(model="random", source="random", configs=configs.folder,
                             config_digests=configs.digests, init_seed=host.diffusers.init_seed)
    elif options.model is None and host.diffusers is not None:
        served = pinned_served(ctx)
    else:
        served = ServedModel(model=redact_text(options.model or ctx.cfg.stack.model_repo),
                             source="by_hand")
    variable = None
    if any(e.allocator for e in entries):  # the one rule: torch reads it back, as the env check
        check = read_back(command[0], Runner(), dict(os.environ))
        if check.status != "pass":
            raise AllocatorUnknown(f"the runner's Python {command[0]}: {check.detail}")
        variable = check.actual
    return AttemptEnvironment(manifest=manifest, digest=digest, served=served,
                              packages=packages, allocator_variable=variable,
                              env=runner.env, host_ram_cap_mib=host_ram_mib), facts


class SnapshotMissing(Refusal):
    """A snapshot-weight host whose pinned snapshot is not in the hub cache."""


def pinned_served(ctx: Context) -> ServedModel:
    """The pinned snapshot's folder in the hub cache, as a Diffusers host with snapshot weights
    loads it (the repo id would resolve through the cache's `main` ref, which need not be the
    pin); refused, naming the cache, when it is not there exactly once."""
    snapshot = pinned_snapshot(ctx.cfg)
    if snapshot is None:
        raise SnapshotMissing(f"no single snapshot of {ctx.cfg.stack.model_snapshot} in the hub "
                              f"cache {hf_cache_dir()}: fetch it there, or pass --model PATH")
    return ServedModel(model=str(snapshot.snapshot_path), source="pinned",
                       revision=snapshot.commit_hash)


class OfflineSession(Session):
    """probe-offline: resumes the host's newest offline attempt (of the cap) made in this
    environment, or with --fresh starts one (once per nox invocation and cap)."""

    def __init__(self, options: OfflineOptions, command: list[str], *,
                 readers: ReaderFactory | None = None, nvml=None, cap_mib: int | None = None):
        self.options, self.command, self.readers, self.nvml = options, command, readers, nvml
        self.cap_mib = cap_mib

    def prepare(self, ctx: Context) -> None:
        self.settings = settings = settings_from(self.options, ctx.cfg, self.cap_mib,
                                                 ctx.host_name)
        if settings.host_ram_mib is not None:
            require_host_ram_cap()  # before any attempt exists
        try:
            self.entries, self.refused, configs = offline_matrix(
                ctx.cfg, ctx.project, ctx.host_name, ctx.host, settings.kwarg_sets)
        except Refusal as exc:
            raise KwargSetNotRunnable(str(exc)) from None
        fixtures = serve_fixtures(ctx.suite, ctx.host, settings.fixtures)
        check_references(fixtures, ctx.project.fixtures_file.parent,
                         max_pixels=ctx.cfg.probe.max_reference_pixels)
        runner = runner_command(ctx.cfg, ctx.project, ctx.host_name, self.options.venv,
                                nvml=self.nvml, out=ctx.out)
        self.runner = runner.argv
        self.environment, _ = offline_environment(ctx, self.options, runner, configs,
                                                   self.entries, nvml=self.nvml,
                                                   host_ram_mib=settings.host_ram_mib)
        if self.environment.served.source == "pinned":  # the runner loads the snapshot folder
            self.settings = replace(self.settings, model=self.environment.served.model)
        for entry in self.entries:  # a profile's allocator variable is the runner's torch's
            entry.runner_env(self.environment.allocator_variable)
        self.plans = {e.name: [Planned(f, s) for f in fixtures for s in
                               (settings.seeds or e.seeds or tuple(ctx.suite.sampling.seeds))]
                      for e in self.entries}

    def open_attempt(self, ctx: Context) -> AttemptStore:
        key = f"{ctx.host_name}-offline" + ("" if self.cap_mib is None else f"@{self.cap_mib}mib")
        weights = ctx.host.diffusers.weights if ctx.host.diffusers else None

        def complete(found: AttemptStore) -> bool:
            done = {(r.kwarg_set, r.fixture, r.seed) for r in found.offline_requests}
            settled = {r.kwarg_set for r in found.offline if r.fixture is None}
            return all(e.name in settled or all((e.name, p.fixture.id, p.seed) in done
                                                for p in self.plans[e.name])
                       for e in self.entries)

        store, self.why = open_run_attempt(ctx, key, self.options.fresh, lambda fresh_id: (
            open_probe_attempt(
                ctx.project, ctx.host_name, ctx.host, self.command, environment=self.environment,
                fresh=self.options.fresh, fresh_id=fresh_id, cap_mib=self.cap_mib,
                complete=complete, kind=ATTEMPT_SUFFIX, what="probe-offline", weights=weights)))
        return store

    def run(self, ctx: Context, store: AttemptStore) -> int:
        out = ctx.out
        print(f"attempt {store.meta.id} ({self.why})", file=out)
        for line in self.refused:
            print(f"refused: {line}", file=out)
        probe = OfflineProbe(ctx.cfg, ctx.suite, ctx.project.fixtures_file.parent, ctx.host_name,
                             store, self.settings, self.runner, out=out,
                             readers=self.readers or default_readers(ctx.host,
                                                                     self.options.gpu_index))
        probe.run(self.entries, self.plans)
        kwarg_sets = [e.name for e in self.entries if e.engine == "omni"]
        checks = offline_checks(ctx.cfg, kwarg_sets, probe.records)
        if checks:
            write_section(store.folder, "propagation.json", checks)
        for check in checks:
            print(describe(check), file=out)
        for name in unchecked_extras(ctx.cfg, kwarg_sets):
            print(f"not checked: whether {name}'s extras reach the model; no kwarg set run "
                  "beside it has its kwargs without them", file=out)
        print(f"attempt {store.meta.id}: evidence in {store.folder.relative_to(ctx.project.root)}, "
              f"artifacts in {store.artifacts}", file=out)
        for line in self.refused + probe.unfinished:
            print(f"not done: {line}", file=out)
        if probe.environment_failures:
            raise EnvironmentFailure(
                "the card was not measured: whole entries failed for an environment cause "
                "(the evidence records it; fix the environment and re-run):\n"
                + "\n".join(f"  {line}" for line in probe.environment_failures))
        print(settled_line(probe.unfinished), file=out)
        return 1 if probe.unfinished else 0

    def close(self) -> None:
        """Nothing beyond the attempt: each record is written as it is made."""

    def interrupted(self, store: AttemptStore) -> str:
        return f"the runner was stopped; re-run to resume attempt {store.meta.id}"


def run_offline(project: Project, options: OfflineOptions, *, command: list[str],
                readers: ReaderFactory | None = None, nvml=None, out: TextIO | None = None) -> int:
    """The probe-offline command: 0 when every planned request was recorded. On an emulated host
    each cap (`--caps`, else the host's) is its own session and attempt.

    `command` is the command line recorded as the attempt's provenance; `nvml` stands in for
    pynvml in a real host's env checks, as for the probe."""
    cfg = load_hosts(project.hosts_file)
    host_name, _ = resolve_host(project, cfg, options.host)
    code = 0
    for cap in probe_caps(cfg, host_name, options.caps_gib):
        code = max(code, run_session(project, OfflineSession(
            options, command, readers=readers, nvml=nvml, cap_mib=cap), options.host, out))
    return code
