"""The serve probe's server lifetimes and request loop: start the server per flag set, sample its
memory, send the fixtures, and record every lifetime and request in the attempt as it happens.

The session around it (which attempt, which caps) is harness/serve/session.py; what it runs,
harness/serve/plan.py; where the server runs from, harness/common/probe_env.py.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TextIO

import requests

from omniprobe.classify.failure_cause import classify_failure
from omniprobe.classify.oom import merge, parse_oom
from omniprobe.config.fixtures import Fixture, FixtureSuite
from omniprobe.config.hosts import HostsConfig
from omniprobe.env.serve_command import (
    FlagSetNotRunnable,
    server_command,
    server_env,
)
from omniprobe.errors import HarnessError
from omniprobe.evidence.attempts import AttemptStore
from omniprobe.evidence.consistency import Bounds, memory_bound, peaks_within_memory
from omniprobe.evidence.load import Evidence, LoadedAttempt, load_attempt
from omniprobe.evidence.models.common import FailureCause
from omniprobe.evidence.models.requests import RequestRecord
from omniprobe.evidence.models.runs import InitResult, ServerLifetime, ServeRun
from omniprobe.harness.common import interrupt
from omniprobe.harness.common.lifetime import (
    Ended,
    Lifetimes,
    ProcessSpec,
    ReaderFactory,
    Running,
    default_readers,
)
from omniprobe.harness.common.logs import (
    DEPLOY_IGNORED_WARNING,
    deploy_config_ignored,
    log_tail,
    read_from,
)
from omniprobe.harness.common.plan import (
    Pace,
    estimate,
    init_settled,
    plan_line,
)
from omniprobe.harness.common.process import Endpoints
from omniprobe.harness.common.progress import Progress
from omniprobe.harness.common.recorder import record_request
from omniprobe.harness.common.sampler import MIB
from omniprobe.harness.common.selection import serve_fixtures
from omniprobe.harness.common.urls import base_url, url
from omniprobe.harness.serve import client
from omniprobe.harness.serve.plan import ServeSettings, select_flag_sets
from omniprobe.harness.serve.record_writer import RecordWriter, run_from_lifetimes
from omniprobe.redaction import redact_args, redact_text


class ImpossibleFigure(HarnessError):
    """The server reported a figure no record may hold (a peak above the GPU's memory)."""


@dataclass(frozen=True)
class LiveServer:
    """A server lifetime that came up (or failed to), as the request loop sees it."""

    running: Running
    init: InitResult
    index: int
    folder: Path


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
        self.lifetimes = Lifetimes(host_name, self.host, settings,
                                   readers or default_readers(self.host),
                                   store.project.artifacts_dir)
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.base_url = base_url(cfg.serve.bind_host, settings.port)
        self.http = requests.Session()
        self.recorder = RecordWriter()
        self.refused: list[str] = []
        self.refused_flag_sets: set[str] = set()
        self.unfinished: list[str] = []
        # What the session says of its attempt (new or resumed, and why), the host's pace so far,
        # and the command that measures again; a session that always starts anew keeps these.
        self.attempt_why = "new: every run of this session starts one"
        self.pace = Pace(None, None, 0)
        self.rerun_command = "the same command"
        # Flag sets that failed as a whole for an environment cause: the card was not measured.
        self.environment_failures: list[str] = []
        self._request_causes: dict[str, list[FailureCause | None]] = {}

    # --- plan ------------------------------------------------------------------------

    def flag_sets(self) -> list[str]:
        return select_flag_sets(self.host_name, self.host, self.settings.flag_sets)

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

    @contextmanager
    def lifetime(self, flag_set: str, session: str, command: list[str]) -> Iterator[LiveServer]:
        run = self.store.run(flag_set)
        index = len(run.lifetimes) if run else 0
        folder = self.store.artifacts / flag_set / f"{session}-{index + 1}"
        env = server_env(self.cfg, flag_set, self.base_env, self.env_bin,
                         alloc_var=self.alloc_var)
        serve = self.cfg.serve
        spec = ProcessSpec(command, env, folder / "server.log", "server", flag_set,
                           f"server lifetime {index}",
                           Endpoints(self.base_url, serve.health_path, serve.ready_path),
                           last_sample=True)
        record = None

        def keep(end: Ended) -> None:
            self.http.close()  # its pooled connections were to the server just stopped
            self.recorder.drain()
            if record is None:
                return
            timeline = end.timeline
            if end.idle is not None:
                timeline = timeline.model_copy(update={
                    "first_idle_mib": round(end.idle.first_idle / MIB, 1),
                    "idle_mib": round(end.idle.used / MIB, 1)})
            self._put_lifetime(flag_set, index, record.model_copy(update={
                "ended": end.ended, "log": end.log, "timeline": timeline,
                "deploy_config_ignored": self._deploy_ignored(flag_set, spec.log_path)}))

        with self.lifetimes.run(spec, keep) as running:
            server = running.process
            init = server.wait_ready(self.settings.ready_timeout_s, self.settings.poll_s)
            if init.outcome == "error":  # exited: the kernel may have killed it for host RAM
                host = running.host_ram(server.returncode(), read_from(server.log_path))
                init = init if host is None else init.model_copy(update={"cause": host})
            record = ServerLifetime(session=session, started_at=running.started_at,
                                    command=redact_args(command), init=init,
                                    cuda_visible_devices=str(self.settings.gpu_index),
                                    request_timeout_s=self.settings.request_timeout_s,
                                    server_group=server.pid, server_started=server.started_at)
            self._put_lifetime(flag_set, index, record)
            yield LiveServer(running, init, index, folder)

    # --- probe-init -----------------------------------------------------------------------

    def probe_init(self) -> None:
        flag_sets = self.flag_sets()
        todo = [f for f in flag_sets if not init_settled(_init(self.store.run(f)),
                                                         self.store.accept_timeouts)]
        progress = Progress(len(todo), self.out)
        progress.say(plan_line(
            "probe-init", self.host_name, self.store.meta.id, self.attempt_why,
            flag_sets=len(flag_sets), fixtures=0, seeds=0, recorded=len(flag_sets) - len(todo),
            to_run=len(todo), time=estimate(self.pace, len(todo), 0), rerun_command=self.rerun_command))
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
            if init_settled(_init(run), self.store.accept_timeouts) and run.init.outcome != "ready":
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
            time=estimate(self.pace, len(plan), progress.total), rerun_command=self.rerun_command))
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
                    if init_settled(_init(self.store.run(flag_set)), self.store.accept_timeouts):
                        progress.say(f"[{label}] {len(pending)} request(s) not sent: the init "
                                     f"{live.init.outcome} on record settles them")
                    else:
                        self.unfinished.append(f"{flag_set}: {len(pending)} request(s) not "
                                               f"sent, init {live.init.outcome}"
                                               + _failure_text(live.init))
                    return
                while pending:
                    fixture, seed = pending.pop(0)
                    alive = self._request(live, flag_set, fixture, seed, progress, label)
                    if not alive:
                        break
            if pending:
                restarts += 1
                if restarts > self.settings.max_restarts:
                    self.unfinished.append(f"{flag_set}: {len(pending)} request(s) not sent "
                                           f"after {restarts - 1} restart(s); re-run to resume")
                    return

    def _healthy(self, live: LiveServer) -> bool:
        if live.running.process.returncode() is not None:
            return False
        try:
            status = self.http.get(url(self.base_url, self.cfg.serve.health_path), timeout=5)
        except requests.RequestException:
            return False
        return status.status_code == 200

    def _request(self, live: LiveServer, flag_set: str, fixture: Fixture, seed: int,
                 progress: Progress, label: str) -> bool:
        """Send one request and hand it to the recorder, which shows it once it is on disk;
        returns whether the server can go on."""
        log_start = live.running.process.log_path.stat().st_size
        started_s = time.monotonic() - live.running.t0
        # In a worker thread: an interrupt ends the wait at once, and the lifetime's exit stops
        # the server the abandoned request waits on.
        reply = interrupt.call(client.send, self.base_url, fixture, seed, self.suite.sampling,
                               self.fixtures_dir, self.settings.request_timeout_s,
                               session=self.http)
        # After a timeout the server may still be busy with the request: start afresh.
        alive = reply.outcome == "ok" or (reply.outcome != "timeout" and self._healthy(live))
        log = read_from(live.running.process.log_path, log_start)
        oom = (merge(reply.oom, parse_oom(log, "request", tuple(self.host.model_code)))
               if reply.outcome == "oom" else None)
        error = reply.error
        # No answer at all, and no exit of the server's own: the harness lost it (refused, or
        # killed by a signal), which measured nothing about the model.
        transport = reply.transport_failure
        host = None
        if not alive and reply.outcome != "timeout":
            code = live.running.process.wait_exit(2)  # a crashed server may take a moment to be reaped
            # The kernel killed it for host RAM: the host's answer, never sent again.
            host = live.running.host_ram(code, log)
            # Killed by a signal: -N from Popen, 128 + N from the keeper.
            transport = (transport and host is None
                         and (code is None or code < 0 or code > 128))
            error = (f"{error}; the server is down"
                     + (f" (exited {code})" if code is not None else "")
                     + f"; its log ends: {log_tail(log)}")
        # A connection to a server that is down is its death, not the environment's: only the
        # log says why it died.
        cause = (None if reply.outcome == "ok" else host or classify_failure(
            log if not alive and reply.outcome != "timeout" else f"{error or ''}\n{log}",
            tuple(self.host.model_code)))
        self._request_causes.setdefault(flag_set, []).append(cause)
        fields = {"flag_set": flag_set, "fixture": fixture.id, "inputs": fixture.inputs,
                  "seed": seed, "outcome": reply.outcome, "structure": "unchecked",
                  "wall_s": round(reply.wall_s, 4),
                  "server_peak_mb": reply.server_peak_mb,
                  "denoise_step_latency_ms": reply.denoise_step_latency_ms, "oom": oom,
                  "error": error and redact_text(error), "cause": cause,
                  "started_s": round(started_s, 3), "lifetime": live.index,
                  "transport_failure": transport}
        if live.running.guard is not None:
            fields["emulation_breach"] = live.running.guard.breach_by(time.monotonic() - live.running.t0)
        path = live.folder / "images" / f"{fixture.id}-{seed}.png"
        restart = "" if alive else " (server down: restarting)"

        def show(record: RequestRecord) -> None:
            progress.step(f"[{label}] {fixture.id} seed {seed}: {record.outcome} "
                          f"{record.wall_s:.2f} s" + _oom_text(record.oom) + restart)
        self.recorder.submit(self._record, fields, reply.image, path, show)
        return alive

    def _record(self, fields: dict, image: bytes | None, path: Path,
                show: Callable[[RequestRecord], None]) -> None:
        """The one recorder's record (the image decoded once, saved, hashed, measured and
        gated), written, and only then shown (on the recorder thread): a request the console
        calls ok is on disk."""
        record = record_request(RequestRecord, fields, image, path,
                                artifacts_dir=self.store.project.artifacts_dir,
                                checks=self.cfg.structure, save=True)
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


def _init(run: ServeRun | None) -> InitResult | None:
    """A flag set's init on record (its latest lifetime's), if any."""
    return run.init if run is not None else None


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


