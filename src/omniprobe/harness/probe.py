"""probe-init and probe-serve: start the server per flag set, sample its memory, send the
fixtures, and record every lifetime and request in the current attempt as it happens.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import TextIO

import requests

from omniprobe.analysis.failure_cause import classify_failure, host_ram_cause
from omniprobe.analysis.oom import merge, parse_oom
from omniprobe.analysis.series import decimate, unavailable
from omniprobe.config.fixtures import Fixture, FixtureNotRunnable, FixtureSuite
from omniprobe.config.host_entry import Host
from omniprobe.config.hosts import HostsConfig, load_hosts
from omniprobe.config.project import Project
from omniprobe.config.selection import (
    INVOCATION_ENV,
    read_state,
    resolve_host,
    session_venv,
    state_path,
    update_state,
)
from omniprobe.env.allocator import honoured_var
from omniprobe.env.check_record import failure_lines
from omniprobe.env.checks import require_env_ok
from omniprobe.env.fetch_model import hf_cache_dir
from omniprobe.env.manifest import env_digest, manifest_of
from omniprobe.env.serve_command import (
    FlagSetNotRunnable,
    base_command,
    flag_set_refusal,
    server_command,
    server_env,
)
from omniprobe.env.simulated import sim_env_digest, sim_preflight
from omniprobe.env.snapshot import pinned_snapshot
from omniprobe.env.state import EnvNotReady
from omniprobe.errors import EnvironmentFailure, HarnessError, Refusal
from omniprobe.evidence.attempts import AttemptStore, file_ref, open_probe_attempt, probe_attempts
from omniprobe.evidence.consistency import Bounds, memory_bound, peaks_within_memory
from omniprobe.evidence.files import parse_file
from omniprobe.evidence.load import Evidence, LoadedAttempt, load_attempt
from omniprobe.evidence.models.attempt import AttemptEnvironment, ServedModel
from omniprobe.evidence.models.common import FailureCause
from omniprobe.evidence.models.requests import RequestRecord
from omniprobe.evidence.models.runs import InitResult, ServerLifetime, ServeRun, TimelineSummary
from omniprobe.harness import client, interrupt
from omniprobe.harness.emulation import (
    EmulationGuard,
    EmulationUnguarded,
    capped_processes,
    emulation_env,
    parse_caps_gib,
)
from omniprobe.harness.host_memory import oom_kill_count
from omniprobe.harness.leftover import stop_leftovers
from omniprobe.harness.logs import (
    DEPLOY_IGNORED_WARNING,
    deploy_config_ignored,
    log_tail,
    read_from,
)
from omniprobe.harness.options import ProbeOptions, ServerOptions, settings_of
from omniprobe.harness.plan import (
    Pace,
    attempt_complete,
    earlier_attempts,
    estimate,
    init_settled,
    pace,
    plan_line,
    settled_line,
    unsettled,
)
from omniprobe.harness.progress import Progress
from omniprobe.harness.recorder import record_request
from omniprobe.harness.sampler import (
    MIB,
    GpuReader,
    IdleReading,
    NvmlReader,
    NvmlUnavailable,
    PublishedMemoryReader,
    Sampler,
    idle_reading,
)
from omniprobe.harness.server import Endpoints, ServerProcess, check_port
from omniprobe.harness.session import Context, Session, run_session
from omniprobe.harness.urls import base_url, url
from omniprobe.redaction import redact_args, redact_file, redact_text

ReaderFactory = Callable[[Path], GpuReader]
# The file a server publishes its memory in (hosts.toml memory_file_env), in its lifetime's folder.
MEMORY_FILE = "published-memory.bin"


class PlanError(Refusal):
    """A flag set or fixture asked for that the host or the fixtures do not have."""


@dataclass(frozen=True)
class ServeSettings:
    """What a serve probe runs with: the command line's options over hosts.toml's defaults."""

    port: int
    model: str
    ready_timeout_s: float
    request_timeout_s: float
    grace_s: float
    sample_hz: float = 10.0
    idle_timeout_s: float = 60.0
    poll_s: float = 0.25
    flag_sets: tuple[str, ...] = ()
    fixtures: tuple[str, ...] = ()
    max_restarts: int = 2
    cap_mib: int | None = None  # an emulated host's cap for this attempt
    gpu_index: int = 0  # NVML's index (PCI bus order): the sampler's device and the server's


@dataclass(frozen=True)
class Live:
    """A running server lifetime, as the request loop sees it."""

    server: ServerProcess
    init: InitResult
    index: int
    t0: float
    folder: Path
    guard: EmulationGuard | None = None
    sampler: Sampler | None = None
    oom_kills: int | None = None  # the cgroup's oom_kill count before the server started


def timeline_summary(sampler: Sampler | None, reason: str | None, hz: float,
                     artifacts_dir: Path) -> TimelineSummary:
    """A stopped sampler's summary with its series file and peak-preserving points (a lifetime
    with no sampler: why not)."""
    if sampler is None:
        return unavailable(reason or "no sampler", hz)
    summary = sampler.stop()
    return summary.model_copy(update={
        "series": file_ref(sampler.path, artifacts_dir) if sampler.path.is_file() else None,
        "points": decimate(sampler.samples)})


def default_readers(host: Host, gpu_index: int = 0) -> ReaderFactory:
    """NVML; on a host whose server publishes its memory in a file (memory_file_env), that file."""
    if host.memory_file_env:
        return lambda folder: PublishedMemoryReader(folder / MEMORY_FILE)
    return lambda folder: NvmlReader(gpu_index)


def settings_from(options: ServerOptions, cfg: HostsConfig, *, flag_sets: tuple[str, ...] = (),
                  fixtures: tuple[str, ...] = ()) -> ServeSettings:
    return settings_of(ServeSettings, options, cfg, flag_sets=flag_sets, fixtures=fixtures)


def serve_fixtures(suite: FixtureSuite, host: Host, wanted: tuple[str, ...] = ()) -> list[Fixture]:
    """The fixtures to serve on the host, fewest references first: those named, else the suite's
    default (each seed fixture where its inputs are stated, else its stand-ins).

    Refuses a simulated fixture on a real host, and names the missing fields of each chosen
    fixture that cannot run (and its stand-ins, which can).
    """
    unknown = sorted(set(wanted) - set(suite.ids))
    if unknown:
        raise PlanError(f"unknown fixture(s) {', '.join(unknown)}; "
                        f"fixtures: {', '.join(suite.ids)}")
    if wanted:
        chosen = [f for f in suite.fixtures if f.id in wanted]
        if not host.simulated and any(f.simulated for f in chosen):
            raise PlanError(f"fixture(s) {', '.join(f.id for f in chosen if f.simulated)} are "
                            "simulated: they run on simulated hosts only")
        _refuse_unrunnable(suite, chosen)
    else:
        chosen, notes = suite.default_fixtures()
        if not chosen:
            raise FixtureNotRunnable("no fixture can run:\n" + "\n".join(notes))
    return sorted(chosen, key=lambda f: f.reference_count)


def _refuse_unrunnable(suite: FixtureSuite, chosen: list[Fixture]) -> None:
    messages = []
    for fixture in chosen:
        try:
            fixture.require_runnable()
        except FixtureNotRunnable as exc:
            standins = [s.id for s in suite.standins_for(fixture.id)]
            messages.append(str(exc) + (f" (or serve its stand-in: --fixture {standins[0]})"
                                        if standins else ""))
    if messages:
        raise FixtureNotRunnable("\n".join(messages))


def check_flag_sets(host_name: str, host: Host, wanted: tuple[str, ...]) -> list[str]:
    """The host's flag sets to run, in hosts.toml order (all of them unless some are wanted)."""
    unknown = sorted(set(wanted) - set(host.serve_flag_sets))
    if unknown:
        raise PlanError(f"flag set(s) {', '.join(unknown)} are not run on host {host_name!r} "
                       f"(its flag sets: {', '.join(host.serve_flag_sets)})")
    return [f for f in host.serve_flag_sets if not wanted or f in wanted]


def run_from_lifetimes(flag_set: str, lifetimes: list[ServerLifetime]) -> ServeRun:
    """A flag set's run: the latest lifetime's init, the device peak over all of them."""
    timelines = [lt.timeline for lt in lifetimes if lt.timeline and lt.timeline.state == "sampled"]
    peaks = [t.device_peak_mib for t in timelines if t.device_peak_mib is not None]
    samplers = sorted({f"{t.sampler} at {t.target_hz:g} Hz" for t in timelines})
    return ServeRun(flag_set=flag_set, init=lifetimes[-1].init,
                    gpu_peak_mib=round(max(peaks)) if peaks else None,
                    gpu_sampler=", ".join(samplers) or None, lifetimes=lifetimes)


class ImpossibleFigure(HarnessError):
    """The server reported a figure no record may hold (a peak above the GPU's memory)."""


class SamplerDied(HarnessError):
    """The memory sampler ended before its server did: the lifetime's timeline is incomplete."""


class RecordNotWritten(EnvironmentFailure):
    """A request's record or image could not be written (the disk is full or read-only)."""


class Recorder:
    """Finishes each record off the request path, in order: decoding the image for its pixel
    hash and quality metrics costs more than the rest of the harness, and overlaps the next
    request this way."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recorder")
        self._pending: list[Future] = []

    def submit(self, fn, *args) -> None:
        self._pending.append(self._pool.submit(fn, *args))

    def drain(self) -> None:
        """Wait for every submitted record; a failure to write one is raised here, as the
        machine's (a full or read-only disk), once every other record had its chance."""
        pending, self._pending = self._pending, []
        failed: list[OSError] = []
        for future in pending:
            try:
                future.result()
            except OSError as exc:
                failed.append(exc)
        if failed:
            raise RecordNotWritten(
                f"{len(failed)} request record(s) could not be written ({failed[0]}); the "
                "attempt holds every request shown above: free the space and re-run to resume")

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._pool.shutdown()


class ServeProbe:
    """Server lifetimes per flag set and the requests sent to them, recorded in one attempt."""

    def __init__(self, cfg: HostsConfig, suite: FixtureSuite, fixtures_dir: Path, hosts_file: Path,
                 host_name: str, store: AttemptStore, settings: ServeSettings, *,
                 readers: ReaderFactory | None = None, base_env: dict[str, str] | None = None,
                 env_bin: Path | None = None, alloc_var: str | None = None,
                 out: TextIO = sys.stderr):
        self.cfg, self.suite = cfg, suite
        self.alloc_var = alloc_var
        self.env_bin = env_bin  # the probe env's bin folder: the server runs from it
        self.fixtures_dir, self.hosts_file = fixtures_dir, hosts_file
        self.host_name, self.host = host_name, cfg.host(host_name)
        self.store, self.settings, self.out = store, settings, out
        self.readers = readers or default_readers(self.host)
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.baseline: int | None = None
        self.base_url = base_url(cfg.serve.bind_host, settings.port)
        self.http = requests.Session()
        self.recorder = Recorder()
        self.refused: list[str] = []
        self.refused_flag_sets: set[str] = set()
        self.unfinished: list[str] = []
        # What the session says of its attempt (new or resumed, and why), the host's pace so far,
        # and the command that measures again; a session that always starts anew keeps these.
        self.attempt_why = "new: every run of this session starts one"
        self.pace = Pace(None, None, 0)
        self.again = "the same command"
        # Flag sets that failed as a whole for an environment cause: the card was not measured.
        self.environment_failures: list[str] = []
        self._request_causes: dict[str, list[FailureCause | None]] = {}

    # --- plan ------------------------------------------------------------------------

    def flag_sets(self) -> list[str]:
        return check_flag_sets(self.host_name, self.host, self.settings.flag_sets)

    def _command(self, flag_set: str) -> list[str] | None:
        try:
            return server_command(self.cfg, self.host_name, flag_set, port=self.settings.port,
                                  model=self.settings.model, hosts_file=self.hosts_file,
                                  bin_dir=self.env_bin)
        except FlagSetNotRunnable as exc:
            self.refused.append(str(exc))
            self.refused_flag_sets.add(flag_set)
            print(f"refused: {exc}", file=self.out, flush=True)
            return None

    # --- one server lifetime --------------------------------------------------------------

    def _reader(self, folder: Path) -> tuple[GpuReader | None, str | None]:
        try:
            return self.readers(folder), None
        except NvmlUnavailable as exc:
            return None, str(exc)

    def _wait_idle(self, reader: GpuReader | None) -> IdleReading | None:
        if reader is None:
            return None
        idle = idle_reading(reader, self.baseline, timeout_s=self.settings.idle_timeout_s,
                            tolerance_mib=self.host.idle_tolerance_mib,
                            poll_s=min(self.settings.poll_s, 0.5))
        self.baseline = idle.baseline
        return idle

    def _deploy_ignored(self, flag_set: str, log_path: Path) -> bool | None:
        """Whether upstream's log says it ignored the flag set's deploy config (None: it passes
        none); a warning when it did, since the flag set then measures its base."""
        if not self.cfg.flag_sets[flag_set].deploy_config:
            return None
        ignored = deploy_config_ignored(read_from(log_path))
        if ignored:
            print(f"warning: [{flag_set}] the server logged {DEPLOY_IGNORED_WARNING!r}: its "
                  "--deploy-config was ignored, so it measures its base configuration",
                  file=self.out, flush=True)
        return ignored

    def _put_lifetime(self, flag_set: str, index: int, lifetime: ServerLifetime) -> None:
        run = self.store.run(flag_set)
        lifetimes = list(run.lifetimes) if run else []
        lifetimes[index:index + 1] = [lifetime]
        self.store.put_run(run_from_lifetimes(flag_set, lifetimes))

    def _timeline(self, sampler: Sampler | None, reason: str | None) -> TimelineSummary:
        return timeline_summary(sampler, reason, self.settings.sample_hz,
                                self.store.project.artifacts_dir)

    @contextmanager
    def lifetime(self, flag_set: str, session: str, command: list[str]) -> Iterator[Live]:
        run = self.store.run(flag_set)
        index = len(run.lifetimes) if run else 0
        folder = self.store.artifacts / flag_set / f"{session}-{index + 1}"
        folder.mkdir(parents=True, exist_ok=True)
        reader, reason = self._reader(folder)
        cap = self.settings.cap_mib
        if cap is not None and reader is None:
            raise EmulationUnguarded(f"host {self.host_name!r} is emulated, but its server's "
                                     f"memory cannot be sampled to check the cap: {reason}")
        idle = self._wait_idle(reader)
        env = server_env(self.cfg, flag_set, self.base_env, self.env_bin,
                         alloc_var=self.alloc_var)
        if self.host.memory_file_env:
            env[self.host.memory_file_env] = str(folder / MEMORY_FILE)
        # The server runs on the device the sampler watches (--gpu-index; CUDA numbers the GPUs
        # in PCI bus order, as NVML does: server_env).
        env["CUDA_VISIBLE_DEVICES"] = str(self.settings.gpu_index)
        guard = None
        if cap is not None:
            env.update(emulation_env(self.host, cap, env))
            guard = EmulationGuard(cap, None if self.baseline is None else self.baseline / MIB)
        serve = self.cfg.serve
        server = ServerProcess(command, env, folder / "server.log",
                               Endpoints(self.base_url, serve.health_path, serve.ready_path),
                               grace_s=self.settings.grace_s,
                               model_code=tuple(self.host.model_code))
        started_at = datetime.now(UTC)
        record = sampler = None
        oom_kills = oom_kill_count()
        finished = False
        server.start()
        t0 = server.started  # one origin for the init time, the series and the requests
        try:
            if reader is not None:
                sampler = Sampler(reader, folder / "timeline.jsonl", hz=self.settings.sample_hz,
                                  root_pid=lambda: server.pid, t0=t0, guard=guard)
                sampler.start()
            init = server.wait_ready(self.settings.ready_timeout_s, self.settings.poll_s)
            if init.outcome == "error":  # exited: the kernel may have killed it for host RAM
                host = host_ram_failure(sampler, oom_kills, server.returncode(),
                                        read_from(server.log_path))
                init = init if host is None else init.model_copy(update={"cause": host})
            record = ServerLifetime(session=session, started_at=started_at,
                                    command=redact_args(command), init=init,
                                    cuda_visible_devices=env["CUDA_VISIBLE_DEVICES"],
                                    request_timeout_s=self.settings.request_timeout_s,
                                    server_group=server.pid, server_started=server.started_at)
            self._put_lifetime(flag_set, index, record)
            yield Live(server, init, index, t0, folder, guard, sampler, oom_kills)
            finished = True
        finally:
            if sampler is not None:
                sampler.sample_now()
            ended = server.stop()
            self.http.close()  # its pooled connections were to the server just stopped
            self.recorder.drain()
            timeline = self._timeline(sampler, reason)
            if idle is not None:
                timeline = timeline.model_copy(update={
                    "idle_baseline_mib": round(idle.baseline / MIB, 1),
                    "idle_mib": round(idle.used / MIB, 1)})
            if guard is not None:
                capped = capped_processes(read_from(server.log_path))
                timeline = timeline.model_copy(update={"emulation": guard.check(capped)})
            if record is not None:
                redact_file(server.log_path)
                log = file_ref(server.log_path, self.store.project.artifacts_dir)
                self._put_lifetime(flag_set, index, record.model_copy(
                    update={"ended": ended, "log": log, "timeline": timeline,
                            "deploy_config_ignored": self._deploy_ignored(flag_set,
                                                                          server.log_path)}))
            if finished and timeline.state == "incomplete":
                # Recorded as incomplete first; a peak read off a cut series would be a wrong one.
                raise SamplerDied(f"[{flag_set}] {timeline.reason}; the timeline of server "
                                  f"lifetime {index} is recorded as incomplete (re-run to resume)")

    # --- probe-init -----------------------------------------------------------------------

    def probe_init(self) -> None:
        flag_sets = self.flag_sets()
        todo = [f for f in flag_sets if not init_settled(self.store.run(f))]
        progress = Progress(len(todo), self.out)
        progress.say(plan_line(
            "probe-init", self.host_name, self.store.meta.id, self.attempt_why,
            flag_sets=len(flag_sets), fixtures=0, seeds=0, recorded=len(flag_sets) - len(todo),
            to_run=len(todo), time=estimate(self.pace, len(todo), 0), again=self.again))
        for number, flag_set in enumerate(todo, 1):
            command = self._command(flag_set)
            if command is None:
                continue
            progress.say(f"[{flag_set} {number}/{len(todo)}] starting the server")
            with self.lifetime(flag_set, "probe-init", command) as live:
                init = live.init
            self._init_failed_for_environment(flag_set, init)
            progress.step(f"[{flag_set} {number}/{len(todo)}] init {init.outcome} after "
                          f"{init.time_s:g} s" + _oom_text(init.oom) + _failure_text(init)
                          + _cause_text(init.cause)
                          + _peak(self.store.run(flag_set)))

    # --- probe-serve ----------------------------------------------------------------------

    def probe_serve(self) -> None:
        fixtures = serve_fixtures(self.suite, self.host, self.settings.fixtures)
        seeds = self.suite.sampling.seeds
        plan: dict[str, list[tuple[Fixture, int]]] = {}
        served = []
        for flag_set in self.flag_sets():
            run = self.store.run(flag_set)
            if init_settled(run) and run.init.outcome != "ready":
                print(f"[{flag_set}] skipped: init {run.init.outcome} is recorded in this attempt",
                      file=self.out)
                continue
            served.append(flag_set)
            pending = [(f, s) for f in fixtures for s in seeds
                       if not self.store.recorded(flag_set, f.id, s)]
            if pending:
                plan[flag_set] = pending
        progress = Progress(sum(len(p) for p in plan.values()), self.out)
        cells = len(served) * len(fixtures) * len(seeds)
        progress.say(plan_line(
            "probe-serve", self.host_name, self.store.meta.id, self.attempt_why,
            flag_sets=len(served), fixtures=len(fixtures), seeds=len(seeds),
            recorded=cells - progress.total, to_run=progress.total,
            time=estimate(self.pace, len(plan), progress.total), again=self.again))
        if not self.settings.fixtures:
            for note in self.suite.default_fixtures()[1]:
                progress.say(note)
        for number, (flag_set, pending) in enumerate(plan.items(), 1):
            command = self._command(flag_set)
            if command is not None:
                self._serve_flag_set(f"{flag_set} {number}/{len(plan)}", flag_set, command,
                                     pending, progress)
                self._requests_failed_for_environment(flag_set)

    def _init_failed_for_environment(self, flag_set: str, init: InitResult) -> None:
        if init.cause is not None and init.cause.kind == "environment":
            self.environment_failures.append(f"{flag_set}: init {init.outcome}: {init.cause.reason}")

    def _requests_failed_for_environment(self, flag_set: str) -> None:
        causes = self._request_causes.get(flag_set, [])
        if causes and all(c is not None and c.kind == "environment" for c in causes):
            reasons = sorted({c.reason for c in causes})
            self.environment_failures.append(
                f"{flag_set}: all {len(causes)} request(s) failed: {'; '.join(reasons)}")

    def _serve_flag_set(self, label: str, flag_set: str, command: list[str],
                        pending: list[tuple[Fixture, int]], progress: Progress) -> None:
        restarts = 0
        while pending:
            progress.say(f"[{label}] starting the server")
            with self.lifetime(flag_set, "probe-serve", command) as live:
                progress.say(f"[{label}] init {live.init.outcome} after {live.init.time_s:g} s"
                             + _oom_text(live.init.oom) + _failure_text(live.init))
                if live.init.outcome != "ready":
                    self._init_failed_for_environment(flag_set, live.init)
                    if init_settled(self.store.run(flag_set)):
                        progress.say(f"[{label}] {len(pending)} request(s) not sent: the init "
                                     f"{live.init.outcome} on record settles them")
                    else:
                        self.unfinished.append(f"{flag_set}: {len(pending)} request(s) not "
                                               f"sent, init {live.init.outcome}"
                                               + _failure_text(live.init))
                    return
                while pending:
                    fixture, seed = pending.pop(0)
                    up = self._request(live, flag_set, fixture, seed, progress, label)
                    if not up:
                        break
            if pending:
                restarts += 1
                if restarts > self.settings.max_restarts:
                    self.unfinished.append(f"{flag_set}: {len(pending)} request(s) not sent "
                                           f"after {restarts - 1} restart(s); re-run to resume")
                    return

    def _healthy(self, live: Live) -> bool:
        if live.server.returncode() is not None:
            return False
        try:
            status = self.http.get(url(self.base_url, self.cfg.serve.health_path), timeout=5)
        except requests.RequestException:
            return False
        return status.status_code == 200

    def _request(self, live: Live, flag_set: str, fixture: Fixture, seed: int,
                 progress: Progress, label: str) -> bool:
        """Send one request and hand it to the recorder, which shows it once it is on disk;
        returns whether the server can go on."""
        log_start = live.server.log_path.stat().st_size
        started_s = time.monotonic() - live.t0
        # In a worker thread: an interrupt ends the wait at once, and the lifetime's exit stops
        # the server the abandoned request waits on.
        reply = interrupt.call(client.send, self.base_url, fixture, seed, self.suite.sampling,
                               self.fixtures_dir, self.settings.request_timeout_s,
                               session=self.http)
        # After a timeout the server may still be busy with the request: start afresh.
        up = reply.outcome == "ok" or (reply.outcome != "timeout" and self._healthy(live))
        log = read_from(live.server.log_path, log_start)
        oom = (merge(reply.oom, parse_oom(log, "request", tuple(self.host.model_code)))
               if reply.outcome == "oom" else None)
        error = reply.error
        # No answer at all, and no exit of the server's own: the harness lost it (refused, or
        # killed by a signal), which measured nothing about the model.
        transport = reply.transport_failure
        host = None
        if not up and reply.outcome != "timeout":
            code = live.server.wait_exit(2)  # a crashed server may take a moment to be reaped
            # The kernel killed it for host RAM: the host's answer, never sent again.
            host = host_ram_failure(live.sampler, live.oom_kills, code, log)
            # Killed by a signal: -N from Popen, 128 + N from the keeper.
            transport = (transport and host is None
                         and (code is None or code < 0 or code > 128))
            error = (f"{error}; the server is down"
                     + (f" (exited {code})" if code is not None else "")
                     + f"; its log ends: {log_tail(log)}")
        # A connection to a server that is down is its death, not the environment's: only the
        # log says why it died.
        cause = (None if reply.outcome == "ok" else host or classify_failure(
            log if not up and reply.outcome != "timeout" else f"{error or ''}\n{log}",
            tuple(self.host.model_code)))
        self._request_causes.setdefault(flag_set, []).append(cause)
        fields = {"flag_set": flag_set, "fixture": fixture.id, "inputs": fixture.inputs,
                  "seed": seed, "outcome": reply.outcome, "quality": "unchecked",
                  "wall_s": round(reply.wall_s, 4),
                  "server_peak_mb": reply.server_peak_mb,
                  "denoise_step_latency_ms": reply.denoise_step_latency_ms, "oom": oom,
                  "error": error and redact_text(error), "cause": cause,
                  "started_s": round(started_s, 3), "lifetime": live.index,
                  "transport_failure": transport}
        if live.guard is not None:
            fields["emulation_breach"] = live.guard.breach_by(time.monotonic() - live.t0)
        path = live.folder / "images" / f"{fixture.id}-{seed}.png"
        restart = "" if up else " (server down: restarting)"

        def show(record: RequestRecord) -> None:
            progress.step(f"[{label}] {fixture.id} seed {seed}: {record.outcome} "
                          f"{record.wall_s:.2f} s" + _oom_text(record.oom) + restart)
        self.recorder.submit(self._record, fields, reply.image, path, show)
        return up

    def _record(self, fields: dict, image: bytes | None, path: Path,
                show: Callable[[RequestRecord], None]) -> None:
        """The one recorder's record (the image decoded once, saved, hashed, measured and
        gated), written, and only then shown (on the recorder thread): a request the console
        calls ok is on disk."""
        record = record_request(RequestRecord, fields, image, path,
                                artifacts_dir=self.store.project.artifacts_dir,
                                checks=self.cfg.quality, save=True)
        impossible = [message for _, _, message in peaks_within_memory(
            replace(self.checked, requests=[record]), self.bounds)]
        if impossible:  # validate would refuse the attempt: the server broke its contract
            raise ImpossibleFigure(f"[{record.flag_set}] {record.fixture} seed {record.seed}: "
                                   f"the server reported {'; '.join(impossible)}; the record is "
                                   "not written")
        self.store.add_request(record)
        show(record)

    @cached_property
    def checked(self) -> LoadedAttempt:
        """The attempt as validate sees it, for the bounds of what the probe writes to it."""
        return LoadedAttempt(self.store.folder, self.store.meta)

    @cached_property
    def bounds(self) -> Bounds:
        env = self.store.meta.environment
        manifest = None
        if env is not None and env.manifest is not None:
            manifest, _ = load_attempt(self.store.project.evidence_dir / self.host_name
                                       / env.manifest)
        return memory_bound(self.checked, self.host, Evidence([manifest] if manifest else []))


def host_ram_failure(sampler: Sampler | None, oom_kills: int | None, returncode: int | None,
                     text: str, count: Callable[[], int | None] = oom_kill_count
                     ) -> FailureCause | None:
    """The host's cause of a server or runner that died of host RAM, read off the cgroup's OOM
    kills since `oom_kills` (`count`: the harness's own cgroup's, or an emulated host RAM cap's)
    and the sampler's last readings (analysis/host_ram.py)."""
    after = count()
    return host_ram_cause(
        None if oom_kills is None or after is None else (oom_kills, after), returncode,
        list(sampler.host_available_mib) if sampler else None, text,
        sampler.gpu_free_mib if sampler else None)


def _oom_text(oom) -> str:
    if oom is None:
        return ""
    where = f" at {oom.location}" if oom.location else ""
    return f" (tried to allocate {oom.requested}{where})" if oom.requested else where


def _cause_text(cause: FailureCause | None) -> str:
    return f" ({cause.kind}: {cause.reason})" if cause is not None and cause.kind != "card" else ""


def _failure_text(init: InitResult) -> str:
    """The server's own words when it did not come up (an exit at import, a refused flag, a
    timeout), so a run never stops on a later symptom such as a refused connection."""
    return f": {init.note}" if init.outcome in ("error", "timeout") and init.note else ""


def _peak(run: ServeRun | None) -> str:
    return f", GPU peak {run.gpu_peak_mib:,} MiB" if run and run.gpu_peak_mib is not None else ""


def resumable_runs(project: Project, host_name: str, cap_mib: int | None) -> list[ServeRun]:
    """The runs of the host's newest probe attempt (of the cap), the one a resume would take."""
    existing = probe_attempts(project.evidence_dir / host_name, cap_mib)
    runs = existing[-1] / "runs.json" if existing else None
    return parse_file(runs) if runs is not None and runs.is_file() else []


@dataclass(frozen=True)
class ProbeEnv:
    """Where the server runs from (None: the simulator) and what the attempt records of it."""

    bin_dir: Path | None
    record: AttemptEnvironment
    alloc_var: str | None = None  # the allocator variable the env's torch honours


def prepare_env(project: Project, cfg: HostsConfig, host_name: str, *, by_hand: str | None,
                venv: str | None, flag_sets: tuple[str, ...] = (), nvml=None,
                out: TextIO | None = None) -> ProbeEnv:
    """The host's verified env and the model its server is given: the snapshot folder the env
    check found at the pinned revision, unless --model gave one by hand (recorded as such).
    EnvNotReady names each failed check; NotInEnv when the env lacks the serve program. Each
    upstream contract check the env's clone fails is a warning on `out`, before any GPU time is
    spent. A simulated host's server is omniprobe's own sim; its serve preflight (of
    `flag_sets`; empty: all) still runs."""
    if cfg.host(host_name).simulated:
        failed = failure_lines(sim_preflight(cfg, project, host_name, flag_sets=flag_sets))
        if failed:
            raise EnvNotReady(f"the serve preflight of host {host_name!r} fails, so no server "
                              "is started:\n" + "\n".join(f"  {line}" for line in failed))
        served = ServedModel(model=redact_text(by_hand) if by_hand else cfg.stack.model_repo,
                             source="by_hand" if by_hand else "simulated")
        return ProbeEnv(None, AttemptEnvironment(digest=sim_env_digest(), served=served))
    verification = require_env_ok(host_name, project=project, nvml=nvml, out=out,
                                   venv=session_venv(project, host_name) or venv)
    snapshot = None if by_hand else pinned_snapshot(cfg)
    if by_hand:
        served = ServedModel(model=redact_text(by_hand), source="by_hand")
    elif snapshot is None:  # the model.snapshot check passed a moment ago: the cache changed
        raise EnvNotReady(f"no single snapshot of {cfg.stack.model_snapshot} in the hub cache "
                          f"{hf_cache_dir()}; run `omniprobe env check --host {host_name}`")
    else:
        served = ServedModel(model=str(snapshot.snapshot_path), source="pinned",
                             revision=snapshot.commit_hash)
    bin_dir = verification.paths.bin_dir
    base_command(cfg, host_name, model=by_hand or served.model, hosts_file=project.hosts_file,
                 bin_dir=bin_dir)
    digest = env_digest(verification.manifest.pins, verification.checks, str(verification.paths.venv))
    return ProbeEnv(bin_dir, AttemptEnvironment(
        manifest=manifest_of(project.evidence_dir, host_name, digest), digest=digest,
        served=served, env="probe"), honoured_var(verification.checks))


def open_run_attempt(ctx: Context, key: str, fresh: bool,
                     opening: Callable[[str | None], tuple[AttemptStore, str]]
                     ) -> tuple[AttemptStore, str]:
    """The attempt `opening` opens, given this nox run's fresh attempt of `key` (the first
    session given --fresh makes it, the sessions after join it); it is remembered for them."""
    invocation = os.environ.get(INVOCATION_ENV)
    state = read_state(state_path(ctx.project, invocation), invocation)
    fresh_id = state.get("fresh_attempts", {}).get(key) if fresh else None
    store, why = opening(fresh_id)
    if fresh and invocation:
        update_state(state_path(ctx.project, invocation), invocation, fresh_attempts={
            **state.get("fresh_attempts", {}), key: store.meta.id})
    return store, why


class ProbeSession(Session):
    """probe-init or probe-serve, the session `name`: resumes the host's newest probe attempt,
    or with --fresh starts one (once per nox invocation: the sessions after join it)."""

    def __init__(self, name: str, options: ProbeOptions, command: list[str], *,
                 readers: ReaderFactory | None = None, nvml=None, cap_mib: int | None = None):
        self.name, self.options, self.command = name, options, command
        self.readers, self.nvml, self.cap_mib = readers, nvml, cap_mib
        self.probe: ServeProbe | None = None

    def prepare(self, ctx: Context) -> None:
        self.settings = replace(settings_from(self.options, ctx.cfg,
                                              flag_sets=self.options.flag_sets,
                                              fixtures=self.options.fixtures),
                                cap_mib=self.cap_mib)
        check_flag_sets(ctx.host_name, ctx.host, self.settings.flag_sets)
        if self.name == "probe-serve":
            fixtures = serve_fixtures(ctx.suite, ctx.host, self.settings.fixtures)
            client.check_references(fixtures, ctx.project.fixtures_file.parent,
                                    max_pixels=ctx.cfg.probe.max_reference_pixels)
        self.env = prepare_env(ctx.project, ctx.cfg, ctx.host_name, by_hand=self.options.model,
                               venv=self.options.venv, flag_sets=self.settings.flag_sets,
                               nvml=self.nvml, out=ctx.out)
        self.env_bin = self.env.bin_dir
        # The server gets the model as given; the record holds it with its secrets redacted.
        self.settings = replace(self.settings,
                                model=self.options.model or self.env.record.served.model)
        if not self.options.fresh:  # the attempt a resume takes: a server it left is its own
            for line in stop_leftovers(resumable_runs(ctx.project, ctx.host_name, self.cap_mib)):
                print(line, file=ctx.out)
        check_port(ctx.cfg.serve.bind_host, self.settings.port)

    def _plan(self, ctx: Context) -> tuple[list[str], list[tuple[str, int]]]:
        """What this run asks of an attempt: its flag sets and every (fixture, seed) cell the
        probe-serve of the same options serves (the defaults where none are named)."""
        try:
            fixtures = [f.id for f in serve_fixtures(ctx.suite, ctx.host, self.settings.fixtures)]
        except FixtureNotRunnable:
            fixtures = []
        # A flag set the run refuses (its deploy config's content is unknown) asks nothing.
        flag_sets = [f for f in check_flag_sets(ctx.host_name, ctx.host, self.settings.flag_sets)
                     if flag_set_refusal(ctx.cfg, f, ctx.project.hosts_file) is None]
        return flag_sets, [(f, s) for f in fixtures for s in ctx.suite.sampling.seeds]

    def open_attempt(self, ctx: Context) -> AttemptStore:
        # One fresh attempt per cap on an emulated host: a sweep's sessions join theirs.
        key = ctx.host_name if self.cap_mib is None else f"{ctx.host_name}@{self.cap_mib}mib"
        flag_sets, cells = self._plan(ctx)
        store, self.why = open_run_attempt(ctx, key, self.options.fresh, lambda fresh_id: (
            open_probe_attempt(
                ctx.project, ctx.host_name, ctx.host, self.command, environment=self.env.record,
                fresh=self.options.fresh, fresh_id=fresh_id, cap_mib=self.cap_mib,
                complete=lambda found: attempt_complete(found, flag_sets, cells))))
        return store

    def run(self, ctx: Context, store: AttemptStore) -> int:
        out = ctx.out
        if self.cap_mib is not None:
            print(f"emulated capacity {self.cap_mib:,} MiB ({self.cap_mib / 1024:g} GiB) on "
                  f"{ctx.host.gpu}", file=out)
        if self.env_bin is not None:
            print(f"env {self.env_bin.parent}: every check passed; the server runs from it",
                  file=out)
        self.probe = probe = ServeProbe(
            ctx.cfg, ctx.suite, ctx.project.fixtures_file.parent, ctx.project.hosts_file,
            ctx.host_name, store, self.settings, env_bin=self.env_bin,
            alloc_var=self.env.alloc_var, out=out,
            readers=self.readers or default_readers(ctx.host, self.options.gpu_index))
        probe.attempt_why = self.why
        probe.pace = pace(earlier_attempts(ctx.project.evidence_dir / ctx.host_name,
                                           store.meta.id))
        probe.again = f"nox -s env-{ctx.host_name} {self.name} -- --fresh"
        (probe.probe_init if self.name == "probe-init" else probe.probe_serve)()
        probe.recorder.drain()
        print(f"attempt {store.meta.id}: evidence in {store.folder.relative_to(ctx.project.root)}, "
              f"artifacts in {store.artifacts}", file=out)
        for line in probe.refused + probe.unfinished:
            print(f"not done: {line}", file=out)
        if probe.environment_failures:
            raise EnvironmentFailure(
                "the card was not measured: whole flag set(s) failed for an environment cause "
                "(the evidence records it; fix the environment and re-run):\n"
                + "\n".join(f"  {line}" for line in probe.environment_failures))
        # What this session asks for: each flag set it may start (a refused one cannot run, and
        # says so above) and, for probe-serve, every cell under it.
        flag_sets, cells = self._plan(ctx)
        asked = [f for f in flag_sets if f not in probe.refused_flag_sets]
        left = unsettled(store, asked, cells if self.name == "probe-serve" else [])
        for line in left:
            print(f"unsettled: {line}", file=out)
        print(settled_line(left), file=out)
        return 1 if left else 0

    def close(self) -> None:
        if self.probe is not None:
            self.probe.recorder.close()

    def interrupted(self, store: AttemptStore) -> str:
        return f"the server was stopped; re-run to resume attempt {store.meta.id}"


def run_probe(project: Project, session: str, options: ProbeOptions, *, command: list[str],
              readers: ReaderFactory | None = None, nvml=None, out: TextIO | None = None) -> int:
    """The probe-init / probe-serve command: 0 when every init and cell asked for is settled
    (plan.unsettled), whatever the card answered; the highest of its caps' statuses. On an
    emulated host each cap (`--caps`, else the host's) is its own session and attempt.

    `command` is the command line recorded as the attempt's provenance; `nvml` stands in for
    pynvml in the env's GPU checks (tests fake the GPU there)."""
    cfg = load_hosts(project.hosts_file)
    host_name, _ = resolve_host(project, cfg, options.host)
    code = 0
    for cap in probe_caps(cfg, host_name, options.caps_gib):
        code = max(code, run_session(project, ProbeSession(
            session, options, command, readers=readers, nvml=nvml, cap_mib=cap), options.host, out))
    return code


def probe_caps(cfg: HostsConfig, host_name: str, caps_gib: str | None) -> list[int | None]:
    """The caps to probe in turn, one attempt each: the sweep's, an emulated host's own, or none
    (a real card)."""
    if caps_gib is None:
        return [cfg.emulated_cap_mib(host_name)]
    if cfg.host(host_name).emulation is None:
        raise PlanError(f"--caps sweeps an emulated host's cap; host {host_name!r} is not "
                        "emulated (hosts.toml [hosts.<name>.emulation])")
    try:
        return list(parse_caps_gib(caps_gib))
    except ValueError as exc:
        raise PlanError(str(exc)) from None
