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
from pathlib import Path
from typing import TextIO

import requests

from omniprobe.analysis.imaging import UnreadableImage, decode_pixels, measure, pixels_sha256
from omniprobe.analysis.oom import merge, parse_oom
from omniprobe.analysis.series import decimate, unavailable
from omniprobe.analysis.structure_gate import gate_record
from omniprobe.atomic import write_bytes_atomic
from omniprobe.config.fixtures import Fixture, FixtureNotRunnable, FixtureSuite, load_fixtures
from omniprobe.config.hosts import Host, HostsConfig, load_hosts
from omniprobe.config.project import Project
from omniprobe.config.selection import (
    INVOCATION_ENV,
    NoHost,
    read_state,
    resolve_host,
    session_venv,
    state_path,
    update_state,
)
from omniprobe.digests import sha256_bytes
from omniprobe.env.checks import require_env_ok
from omniprobe.env.state import EnvError
from omniprobe.evidence.attempts import AttemptBusy, AttemptStore, file_ref, open_attempt
from omniprobe.evidence.models import InitResult, RequestRecord, ServerLifetime, ServeRun, TimelineSummary
from omniprobe.harness import client
from omniprobe.harness.emulation import (
    EmulationGuard,
    EmulationUnguarded,
    capped_processes,
    emulation_env,
    parse_caps_gib,
)
from omniprobe.harness.logs import log_tail, read_from
from omniprobe.harness.progress import Progress
from omniprobe.harness.sampler import (
    MIB,
    GpuBusy,
    GpuReader,
    NvmlReader,
    NvmlUnavailable,
    Sampler,
    SimReader,
    wait_idle,
)
from omniprobe.harness.server import (
    Endpoints,
    FlagSetNotRunnable,
    NotInEnv,
    PortInUse,
    ServerProcess,
    base_command,
    server_command,
    server_env,
    signals_interrupt,
)
from omniprobe.sim.memory import STATE_ENV

ReaderFactory = Callable[[Path], GpuReader]


class PlanError(ValueError):
    """A flag set or fixture asked for that the host or the fixtures do not have."""


@dataclass(frozen=True)
class ProbeOptions:
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


@dataclass(frozen=True)
class Live:
    """A running server lifetime, as the request loop sees it."""

    server: ServerProcess
    init: InitResult
    index: int
    t0: float
    folder: Path
    guard: EmulationGuard | None = None


def default_readers(host: Host, gpu_index: int = 0, cap_mib: int | None = None) -> ReaderFactory:
    """NVML on a real host (and on one emulated on a real GPU); on a simulated one, the memory its
    server publishes, whose total is the emulated cap under the sim-account mechanism."""
    emulation = host.emulation
    if host.simulated and (emulation is None or emulation.mechanism == "sim-account"):
        total = (cap_mib or host.capacity.vram_mib) * MIB
        return lambda folder: SimReader(folder / "sim-memory.bin", total)
    return lambda folder: NvmlReader(gpu_index)


def serve_fixtures(suite: FixtureSuite, host: Host, wanted: tuple[str, ...] = ()) -> list[Fixture]:
    """The host's fixtures (simulated ones on a simulated host), fewest references first.

    Refuses, naming the missing fields of each, when any chosen fixture is not runnable.
    """
    unknown = sorted(set(wanted) - set(suite.ids))
    if unknown:
        raise PlanError(f"unknown fixture(s) {', '.join(unknown)}; "
                        f"fixtures: {', '.join(suite.ids)}")
    chosen = [f for f in suite.fixtures
              if f.simulated == host.simulated and (not wanted or f.id in wanted)]
    refusals = [f for f in chosen if not f.runnable]
    if refusals:
        messages = []
        for fixture in refusals:
            try:
                fixture.require_runnable()
            except FixtureNotRunnable as exc:
                messages.append(str(exc))
        raise FixtureNotRunnable("\n".join(messages))
    if not chosen:
        raise FixtureNotRunnable(f"no {'simulated ' if host.simulated else ''}fixtures to run")
    return sorted(chosen, key=lambda f: f.reference_count)


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
        """Wait for every submitted record; a failure to write one is raised here."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._pool.shutdown()


class Probe:
    def __init__(self, cfg: HostsConfig, suite: FixtureSuite, fixtures_dir: Path, hosts_file: Path,
                 host_name: str, store: AttemptStore, options: ProbeOptions, *,
                 readers: ReaderFactory | None = None, base_env: dict[str, str] | None = None,
                 env_bin: Path | None = None, out: TextIO = sys.stderr):
        self.cfg, self.suite = cfg, suite
        self.env_bin = env_bin  # the probe env's bin folder: the server runs from it
        self.fixtures_dir, self.hosts_file = fixtures_dir, hosts_file
        self.host_name, self.host = host_name, cfg.host(host_name)
        self.store, self.options, self.out = store, options, out
        self.readers = readers or default_readers(self.host)
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.baseline: int | None = None
        self.base_url = f"http://{cfg.serve.bind_host}:{options.port}"
        self.http = requests.Session()
        self.recorder = Recorder()
        self.refused: list[str] = []
        self.unfinished: list[str] = []

    # --- plan ------------------------------------------------------------------------

    def flag_sets(self) -> list[str]:
        return check_flag_sets(self.host_name, self.host, self.options.flag_sets)

    def _command(self, flag_set: str) -> list[str] | None:
        try:
            return server_command(self.cfg, self.host_name, flag_set, port=self.options.port,
                                  model=self.options.model, hosts_file=self.hosts_file,
                                  bin_dir=self.env_bin)
        except FlagSetNotRunnable as exc:
            self.refused.append(str(exc))
            print(f"refused: {exc}", file=self.out, flush=True)
            return None

    # --- one server lifetime --------------------------------------------------------------

    def _reader(self, folder: Path) -> tuple[GpuReader | None, str | None]:
        try:
            return self.readers(folder), None
        except NvmlUnavailable as exc:
            return None, str(exc)

    def _wait_idle(self, reader: GpuReader | None) -> None:
        if reader is not None:
            self.baseline = wait_idle(reader, self.baseline, timeout_s=self.options.idle_timeout_s,
                                      poll_s=min(self.options.poll_s, 0.5))

    def _put_lifetime(self, flag_set: str, index: int, lifetime: ServerLifetime) -> None:
        run = self.store.run(flag_set)
        lifetimes = list(run.lifetimes) if run else []
        lifetimes[index:index + 1] = [lifetime]
        self.store.put_run(run_from_lifetimes(flag_set, lifetimes))

    def _timeline(self, sampler: Sampler | None, reason: str | None) -> TimelineSummary:
        if sampler is None:
            return unavailable(reason or "no sampler", self.options.sample_hz)
        summary = sampler.stop()
        return summary.model_copy(update={
            "series": file_ref(sampler.path, self.store.project.artifacts_dir)
            if sampler.path.is_file() else None,
            "points": decimate(sampler.samples)})

    @contextmanager
    def lifetime(self, flag_set: str, session: str, command: list[str]) -> Iterator[Live]:
        run = self.store.run(flag_set)
        index = len(run.lifetimes) if run else 0
        folder = self.store.artifacts / flag_set / f"{session}-{index + 1}"
        folder.mkdir(parents=True, exist_ok=True)
        reader, reason = self._reader(folder)
        cap = self.options.cap_mib
        if cap is not None and reader is None:
            raise EmulationUnguarded(f"host {self.host_name!r} is emulated, but its server's "
                                     f"memory cannot be sampled to check the cap: {reason}")
        self._wait_idle(reader)
        env = server_env(self.cfg, flag_set, self.base_env, self.env_bin)
        if self.host.simulated:
            env[STATE_ENV] = str(folder / "sim-memory.bin")
        guard = None
        if cap is not None:
            env.update(emulation_env(self.host, cap, env))
            guard = EmulationGuard(cap, None if self.baseline is None else self.baseline / MIB)
        serve = self.cfg.serve
        server = ServerProcess(command, env, folder / "server.log",
                               Endpoints(self.base_url, serve.health_path, serve.ready_path),
                               grace_s=self.options.grace_s)
        started_at = datetime.now(UTC)
        record = sampler = None
        server.start()
        t0 = server.started  # one origin for the init time, the series and the requests
        try:
            if reader is not None:
                sampler = Sampler(reader, folder / "timeline.jsonl", hz=self.options.sample_hz,
                                  root_pid=lambda: server.pid, t0=t0, guard=guard)
                sampler.start()
            init = server.wait_ready(self.options.ready_timeout_s, self.options.poll_s)
            record = ServerLifetime(session=session, started_at=started_at, command=command,
                                    init=init)
            self._put_lifetime(flag_set, index, record)
            yield Live(server, init, index, t0, folder, guard)
        finally:
            ended = server.stop()
            self.recorder.drain()
            timeline = self._timeline(sampler, reason)
            if guard is not None:
                capped = capped_processes(server.log_path.read_text(errors="replace"))
                timeline = timeline.model_copy(update={"emulation": guard.check(capped)})
            if record is not None:
                log = file_ref(server.log_path, self.store.project.artifacts_dir)
                self._put_lifetime(flag_set, index, record.model_copy(
                    update={"ended": ended, "log": log, "timeline": timeline}))

    # --- probe-init -----------------------------------------------------------------------

    def probe_init(self) -> None:
        flag_sets = self.flag_sets()
        todo = [f for f in flag_sets if self.store.run(f) is None]
        progress = Progress(len(todo), self.out)
        progress.say(f"probe-init on {self.host_name}: {len(todo)} of {len(flag_sets)} flag "
                     f"set(s) to start; attempt {self.store.meta.id}")
        for number, flag_set in enumerate(todo, 1):
            command = self._command(flag_set)
            if command is None:
                continue
            progress.say(f"[{flag_set} {number}/{len(todo)}] starting the server")
            with self.lifetime(flag_set, "probe-init", command) as live:
                init = live.init
            progress.step(f"[{flag_set} {number}/{len(todo)}] init {init.outcome} after "
                          f"{init.time_s:g} s" + _oom_text(init.oom)
                          + _peak(self.store.run(flag_set)))

    # --- probe-serve ----------------------------------------------------------------------

    def probe_serve(self) -> None:
        fixtures = serve_fixtures(self.suite, self.host, self.options.fixtures)
        seeds = self.suite.sampling.seeds
        plan: dict[str, list[tuple[Fixture, int]]] = {}
        for flag_set in self.flag_sets():
            run = self.store.run(flag_set)
            if run is not None and run.init.outcome != "ready":
                print(f"[{flag_set}] skipped: init {run.init.outcome} is recorded in this attempt",
                      file=self.out)
                continue
            pending = [(f, s) for f in fixtures for s in seeds
                       if not self.store.recorded(flag_set, f.id, s)]
            if pending:
                plan[flag_set] = pending
        progress = Progress(sum(len(p) for p in plan.values()), self.out)
        progress.say(f"probe-serve on {self.host_name}: {progress.total} request(s) in "
                     f"{len(plan)} run(s); attempt {self.store.meta.id}")
        for number, (flag_set, pending) in enumerate(plan.items(), 1):
            command = self._command(flag_set)
            if command is not None:
                self._serve_flag_set(f"{flag_set} {number}/{len(plan)}", flag_set, command,
                                     pending, progress)

    def _serve_flag_set(self, label: str, flag_set: str, command: list[str],
                        pending: list[tuple[Fixture, int]], progress: Progress) -> None:
        restarts = 0
        while pending:
            progress.say(f"[{label}] starting the server")
            with self.lifetime(flag_set, "probe-serve", command) as live:
                progress.say(f"[{label}] init {live.init.outcome} after {live.init.time_s:g} s"
                             + _oom_text(live.init.oom))
                if live.init.outcome != "ready":
                    self.unfinished.append(f"{flag_set}: {len(pending)} request(s) not sent, "
                                           f"init {live.init.outcome}")
                    return
                while pending:
                    fixture, seed = pending.pop(0)
                    reply, up = self._request(live, flag_set, fixture, seed)
                    progress.step(f"[{label}] {fixture.id} seed {seed}: {reply.outcome} "
                                  f"{reply.wall_s:.2f} s" + _oom_text(reply.oom)
                                  + ("" if up else " (server down: restarting)"))
                    if not up:
                        break
            if pending:
                restarts += 1
                if restarts > self.options.max_restarts:
                    self.unfinished.append(f"{flag_set}: {len(pending)} request(s) not sent "
                                           f"after {restarts - 1} restart(s); re-run to resume")
                    return

    def _healthy(self, live: Live) -> bool:
        if live.server.returncode() is not None:
            return False
        try:
            status = self.http.get(self.base_url + self.cfg.serve.health_path, timeout=5)
        except requests.RequestException:
            return False
        return status.status_code == 200

    def _request(self, live: Live, flag_set: str, fixture: Fixture,
                 seed: int) -> tuple[client.Reply, bool]:
        """Send one request and hand it to the recorder; returns the reply and whether the
        server can go on."""
        log_start = live.server.log_path.stat().st_size
        started_s = time.monotonic() - live.t0
        reply = client.send(self.base_url, fixture, seed, self.suite.sampling, self.fixtures_dir,
                            self.options.request_timeout_s, session=self.http)
        # After a timeout the server may still be busy with the request: start afresh.
        up = reply.outcome == "ok" or (reply.outcome != "timeout" and self._healthy(live))
        log = read_from(live.server.log_path, log_start)
        oom = merge(reply.oom, parse_oom(log, "request")) if reply.outcome == "oom" else None
        error = reply.error
        if not up and reply.outcome != "timeout":
            code = live.server.wait_exit(2)  # a crashed server may take a moment to be reaped
            error = (f"{error}; the server is down"
                     + (f" (exited {code})" if code is not None else "")
                     + f"; its log ends: {log_tail(log)}")
        fields = {"flag_set": flag_set, "fixture": fixture.id, "seed": seed,
                  "outcome": reply.outcome, "quality": "unchecked",
                  "wall_s": round(reply.wall_s, 4),
                  "server_peak_mb": reply.server_peak_mb,
                  "denoise_step_latency_ms": reply.denoise_step_latency_ms, "oom": oom,
                  "error": error, "started_s": round(started_s, 3), "lifetime": live.index}
        if live.guard is not None:
            fields["emulation_breach"] = live.guard.breach_by(time.monotonic() - live.t0)
        path = live.folder / "images" / f"{fixture.id}-{seed}.png"
        self.recorder.submit(self._record, fields, reply.image, path)
        return reply, up

    def _record(self, fields: dict, image: bytes | None, path: Path) -> None:
        """Decode the image once for its pixel hash and quality metrics, save it, then validate,
        gate and write the record (on the recorder)."""
        pixels = None
        if image is not None:
            try:
                pixels = decode_pixels(image, path.name)
            except UnreadableImage as exc:
                fields.update(outcome="error",
                              error=f"malformed response: the image does not decode: {exc}")
            else:
                write_bytes_atomic(path, image)
                fields.update(output_sha256=sha256_bytes(image),
                              pixels_sha256=pixels_sha256(pixels),
                              artifact=str(path.relative_to(self.store.project.artifacts_dir)))
        record = RequestRecord.model_validate(fields)
        if pixels is not None:
            record = gate_record(record, measure(pixels, self.cfg.quality))
        self.store.add_request(record)


def _oom_text(oom) -> str:
    if oom is None:
        return ""
    where = f" at {oom.location}" if oom.location else ""
    return f" (tried to allocate {oom.requested}{where})" if oom.requested else where


def _peak(run: ServeRun | None) -> str:
    return f", GPU peak {run.gpu_peak_mib:,} MiB" if run and run.gpu_peak_mib is not None else ""



def options_from(args, cfg: HostsConfig) -> ProbeOptions:
    serve = cfg.serve
    return ProbeOptions(
        port=args.port or serve.port, model=args.model or cfg.stack.model_repo,
        ready_timeout_s=args.ready_timeout or serve.ready_timeout_s,
        request_timeout_s=args.request_timeout or serve.request_timeout_s,
        grace_s=serve.stop_grace_s if args.grace is None else args.grace,
        sample_hz=args.sample_hz, idle_timeout_s=args.idle_timeout,
        flag_sets=tuple(args.flag_set), fixtures=tuple(args.fixture))


def probe_env(project: Project, cfg: HostsConfig, host_name: str, options: ProbeOptions, *,
              venv: str | None, nvml=None) -> Path | None:
    """The bin folder of the host's verified env, which the server runs from; None for a
    simulated host, whose server is omniprobe's own sim. EnvNotReady names each failed check;
    NotInEnv when the env lacks the serve command's program."""
    if cfg.host(host_name).simulated:
        return None
    venv = session_venv(project, host_name) or venv
    bin_dir = require_env_ok(host_name, project=project, venv=venv, nvml=nvml).paths.bin_dir
    base_command(cfg, host_name, model=options.model, hosts_file=project.hosts_file,
                 bin_dir=bin_dir)
    return bin_dir


def _open(project: Project, cfg: HostsConfig, host_name: str, session: str,
          args, cap_mib: int | None = None) -> AttemptStore:
    """This invocation's attempt (of this cap, on an emulated host): with --fresh, the first
    session creates it and the rest join."""
    invocation = os.environ.get(INVOCATION_ENV)
    state = read_state(state_path(project), invocation)
    key = host_name if cap_mib is None else f"{host_name}@{cap_mib}mib"
    fresh_id = state.get("fresh_attempts", {}).get(key) if args.fresh else None
    store = open_attempt(project, host_name, cfg.host(host_name),
                         ["omniprobe", session, *sys.argv[2:]], fresh=args.fresh,
                         fresh_id=fresh_id, cap_mib=cap_mib)
    if args.fresh and invocation:
        update_state(state_path(project), invocation, fresh_attempts={
            **state.get("fresh_attempts", {}), key: store.meta.id})
    return store


def probe_caps(cfg: HostsConfig, host_name: str, caps_gib: str | None) -> list[int | None]:
    """The caps to probe in turn: the sweep's, an emulated host's own, or none (a real card)."""
    if caps_gib is None:
        return [cfg.emulated_cap_mib(host_name)]
    if cfg.host(host_name).emulation is None:
        raise PlanError(f"--caps sweeps an emulated host's cap; host {host_name!r} is not "
                        "emulated (hosts.toml [hosts.<name>.emulation])")
    try:
        return list(parse_caps_gib(caps_gib))
    except ValueError as exc:
        raise PlanError(str(exc)) from None


def run_probe(project: Project, session: str, args, *, readers: ReaderFactory | None = None,
              nvml=None, out: TextIO = sys.stderr) -> int:
    """The probe-init / probe-serve command: 0 when everything planned was recorded.

    On an emulated host each cap (`--caps`, else the host's) is probed in turn, in its own
    attempt. `nvml` stands in for pynvml in the env's GPU checks (tests fake the GPU there)."""
    cfg = load_hosts(project.hosts_file)
    suite = load_fixtures(project.fixtures_file)
    options = options_from(args, cfg)
    try:
        host_name, why = resolve_host(project, cfg, args.host)
        print(f"host {host_name} ({why})", file=out)
        host = cfg.host(host_name)
        caps = probe_caps(cfg, host_name, getattr(args, "caps", None))
        # Refuse before an attempt exists: a refused run leaves no evidence behind.
        check_flag_sets(host_name, host, options.flag_sets)
        if session == "probe-serve":
            serve_fixtures(suite, host, options.fixtures)
        env_bin = probe_env(project, cfg, host_name, options, venv=args.venv, nvml=nvml)
    except (NoHost, PlanError, FixtureNotRunnable, EnvError, NotInEnv) as exc:
        print(f"error: {exc}", file=out)
        return 1
    if env_bin is not None:
        print(f"env {env_bin.parent}: every check passed; the server runs from it", file=out)
    code = 0
    for cap in caps:
        if cap is not None:
            print(f"emulated capacity {cap:,} MiB ({cap / 1024:g} GiB) on {host.gpu}", file=out)
        code = max(code, _probe_attempt(
            project, cfg, suite, session, args, host_name, replace(options, cap_mib=cap),
            readers or default_readers(host, args.gpu_index, cap), env_bin, out))
        if code > 1:  # interrupted: the rest of a sweep waits for a re-run
            break
    return code


def _probe_attempt(project: Project, cfg: HostsConfig, suite: FixtureSuite, session: str, args,
                   host_name: str, options: ProbeOptions, readers: ReaderFactory,
                   env_bin: Path | None, out: TextIO) -> int:
    """One attempt's probe-init or probe-serve."""
    try:
        store = _open(project, cfg, host_name, session, args, options.cap_mib)
    except AttemptBusy as exc:
        print(f"error: {exc}", file=out)
        return 1
    probe = Probe(cfg, suite, project.fixtures_file.parent, project.hosts_file, host_name, store,
                  options, readers=readers, env_bin=env_bin, out=out)
    try:
        with signals_interrupt():
            (probe.probe_init if session == "probe-init" else probe.probe_serve)()
    except (PortInUse, GpuBusy, EmulationUnguarded) as exc:
        print(f"error: {exc}", file=out)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted: the server was stopped; re-run to resume attempt {store.meta.id}",
              file=out)
        return 130
    finally:
        probe.recorder.close()
        store.close()
    print(f"attempt {store.meta.id}: evidence in {store.folder.relative_to(project.root)}, "
          f"artifacts in {store.artifacts}", file=out)
    for line in probe.refused + probe.unfinished:
        print(f"not done: {line}", file=out)
    return 1 if probe.unfinished else 0
