"""probe-offline: generate the fixtures with an offline `Omni(...)` engine per offline kwarg set.

Each kwarg set runs the runner script (omniprobe/harness/offline_runner.py) with the host's pinned venv
python, in its own process group under omniprobe.harness.supervise, like the server. The runner writes
one JSON line per request; each becomes an OfflineRequest in offline-requests.json (OOM parsed
from the exception's text, the image measured and gated as serve's are), and each kwarg set and
fixture an OfflineRun in offline.json. A kwarg set that is another's plus one setting gets a
propagation check against it (propagation.json), as serve's deploy configs do. A failed request
ends its runner (upstream's engine closes on one) and the rest get a fresh runner; only a lost
runner counts as a restart. Every invocation writes a new attempt (`-offline`).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from omniprobe.analysis.imaging import UnreadableImage, load_pixels, measure, pixels_sha256
from omniprobe.analysis.oom import is_oom, parse_oom
from omniprobe.analysis.structure_gate import quality_of
from omniprobe.analysis.summaries import cell_outcome, cell_quality
from omniprobe.atomic import write_text_atomic
from omniprobe.config.fixtures import Fixture, FixtureSuite
from omniprobe.config.hosts import Host, HostsConfig
from omniprobe.config.project import Project
from omniprobe.config.selection import session_venv
from omniprobe.digests import sha256_bytes
from omniprobe.env.checks import require_env_ok
from omniprobe.errors import HarnessError
from omniprobe.evidence.attempts import AttemptStore, file_ref, new_attempt
from omniprobe.evidence.models import ArtifactRef, OfflineRequest, OfflineRun, write_section
from omniprobe.evidence.quantities import Range
from omniprobe.harness.client import check_references, reference_path
from omniprobe.harness.interrupt import pause
from omniprobe.harness.logs import log_tail
from omniprobe.harness.probe import (
    MEMORY_FILE,
    PlanError,
    ReaderFactory,
    default_readers,
    serve_fixtures,
)
from omniprobe.harness.progress import Progress
from omniprobe.harness.propagation import describe, offline_checks, unchecked_extras
from omniprobe.harness.sampler import NvmlUnavailable, wait_idle
from omniprobe.harness.server import ServerProcess, classify_exit
from omniprobe.harness.session import Context, Session, SessionOptions, run_session
from omniprobe.redaction import redact_file, redact_text
from omniprobe.safe_io import json_loads

RUNNER = Path(__file__).with_name("offline_runner.py")
ATTEMPT_SUFFIX = "-offline"
_PLACEHOLDER = re.compile(r"\{(python|runner|hosts_file|host)\}")


class KwargSetNotRunnable(PlanError):
    """An offline kwarg set whose kwargs the source does not state."""


class RunnerProtocolError(HarnessError):
    """The runner wrote something the protocol does not allow."""


@dataclass(frozen=True)
class OfflineOptions(SessionOptions):
    """probe-offline's command line; empty tuples: all of them (seeds: the sampling seeds)."""

    kwarg_sets: tuple[str, ...] = ()
    fixtures: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()


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


@dataclass(frozen=True)
class Planned:
    fixture: Fixture
    seed: int

    @property
    def id(self) -> str:
        return f"{self.fixture.id}-{self.seed}"


def not_runnable(name: str) -> str:
    return (f"offline kwarg set {name!r} cannot run: hosts.toml [offline_kwarg_sets.{name}] has "
            "no 'kwargs' (the source does not state them); record them there first")


def check_kwarg_sets(cfg: HostsConfig, host_name: str, host: Host,
                     wanted: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(the kwarg sets to run, in hosts.toml order; refusals of those skipped).

    A kwarg set without kwargs is refused: with an error when asked for by name, else skipped.
    """
    unknown = sorted(set(wanted) - set(host.offline_kwarg_sets))
    if unknown:
        raise PlanError(f"offline kwarg set(s) {', '.join(unknown)} are not run on host "
                        f"{host_name!r} (its kwarg sets: "
                        f"{', '.join(host.offline_kwarg_sets) or 'none'})")
    chosen = [k for k in host.offline_kwarg_sets if not wanted or k in wanted]
    refusals = [not_runnable(k) for k in chosen if cfg.offline_kwarg_sets[k].kwargs is None]
    if wanted and refusals:
        raise KwargSetNotRunnable("\n".join(refusals))
    runnable = [k for k in chosen if cfg.offline_kwarg_sets[k].kwargs is not None]
    if not runnable:
        raise KwargSetNotRunnable("\n".join(refusals) if refusals
                                  else f"host {host_name!r} has no offline kwarg sets")
    return runnable, refusals


def runner_command(cfg: HostsConfig, project: Project, host_name: str,
                   venv: str | None = None, *, nvml=None, out: TextIO | None = None) -> list[str]:
    """The host's offline_command, else the pinned venv's python on the runner script; refuses an
    env that fails any check (EnvNotReady names each), as the probe sessions do, and warns on
    `out` of each upstream contract check its clone fails."""
    host = cfg.host(host_name)
    if host.offline_command:
        fill = {"python": sys.executable, "runner": str(RUNNER),
                "hosts_file": str(project.hosts_file), "host": host_name}
        return [_PLACEHOLDER.sub(lambda m: fill[m[1]], part) for part in host.offline_command]
    venv = session_venv(project, host_name) or venv
    paths = require_env_ok(host_name, project=project, venv=venv, nvml=nvml, out=out).paths
    return [str(paths.python), str(RUNNER)]


def runner_env(cfg: HostsConfig, kwarg_set: str, base: dict[str, str]) -> dict[str, str]:
    """Ours, the stack's offline variables, the kwarg set's, and CUDA numbering GPUs as NVML."""
    return {**base, **cfg.stack.offline_env, **cfg.offline_kwarg_sets[kwarg_set].env,
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
class KwargSetState:
    """What one kwarg set's runner processes produced, for its offline.json rows."""

    init_s: float | None = None
    failure: OfflineRun | None = None
    logs: list[ArtifactRef] = field(default_factory=list)


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
        self.records: list[OfflineRequest] = []
        self.runs: list[OfflineRun] = []
        self.unfinished: list[str] = []

    def run(self, kwarg_sets: list[str], plan: list[Planned]) -> None:
        progress = Progress(len(kwarg_sets) * len(plan), self.out)
        progress.say(f"probe-offline on {self.host_name}: {len(plan)} request(s) under each of "
                     f"{len(kwarg_sets)} kwarg set(s); attempt {self.store.meta.id}")
        for number, name in enumerate(kwarg_sets, 1):
            self._kwarg_set(f"{name} {number}/{len(kwarg_sets)}", name, list(plan), progress)

    # --- one kwarg set ----------------------------------------------------------------------

    def _kwarg_set(self, label: str, name: str, pending: list[Planned], progress: Progress) -> None:
        state = KwargSetState()
        restarts = 0
        for index in itertools.count():
            pending, closed = self._lifetime(label, name, index, pending, state, progress)
            if not pending:
                break
            if state.failure is not None:
                if index > 0:  # a restarted runner failed to build: the rest never ran
                    self.unfinished.append(f"{name}: {len(pending)} request(s) not run, the "
                                           f"restarted runner's init ended {state.failure.outcome}")
                break
            if closed:
                continue  # the engine closed on a failed request, as upstream's does: planned
            if restarts >= self.settings.max_restarts:
                self.unfinished.append(f"{name}: {len(pending)} request(s) not run after "
                                       f"{restarts} restart(s); re-run to try them again")
                break
            restarts += 1
        self.runs.extend(self._summary(name, state))
        write_section(self.store.folder, "offline.json", self.runs)

    def _summary(self, name: str, state: KwargSetState) -> list[OfflineRun]:
        """The init failure, if any, then one row per fixture in the order they ran."""
        logs = list(state.logs)
        rows = [state.failure.model_copy(update={"logs": logs})] if state.failure else []
        records = [r for r in self.records if r.kwarg_set == name]
        for fixture in dict.fromkeys(r.fixture for r in records):
            mine = [r for r in records if r.fixture == fixture]
            walls = [r.wall_s for r in mine if r.outcome == "ok"]
            rows.append(OfflineRun(
                kwarg_set=name, fixture=fixture, seeds=sorted({r.seed for r in mine}),
                outcome=cell_outcome([r.outcome for r in mine]), quality=cell_quality(mine),
                oom=next((r.oom for r in mine if r.oom is not None), None),
                wall_s=Range.of(walls) if walls else None, init_s=state.init_s, logs=logs))
        return rows

    # --- one runner process -----------------------------------------------------------------

    def _write_inputs(self, name: str, folder: Path, pending: list[Planned]) -> list[str]:
        images = self.store.artifacts / name / "images"
        images.mkdir(parents=True, exist_ok=True)
        sampling = self.suite.sampling
        requests = [{
            "id": p.id, "fixture": p.fixture.id, "seed": p.seed, "prompt": p.fixture.prompt,
            "width": p.fixture.width, "height": p.fixture.height,
            "references": [str(reference_path(p.fixture, r, self.fixtures_dir))
                           for r in p.fixture.references or []],
            "num_inference_steps": sampling.num_inference_steps,
            "true_cfg_scale": sampling.true_cfg_scale,
            "output": str(images / f"{p.id}.png"),
        } for p in pending]
        kwargs = self.cfg.offline_kwarg_sets[name].kwargs
        write_text_atomic(folder / "kwargs.json", json.dumps(kwargs, indent=2) + "\n")
        write_text_atomic(folder / "requests.json", json.dumps({"requests": requests}, indent=2))
        return ["--model", self.settings.model, "--kwargs-file", str(folder / "kwargs.json"),
                "--requests", str(folder / "requests.json"),
                "--results", str(folder / "results.jsonl")]

    def _wait_idle(self, folder: Path) -> None:
        try:
            reader = self.readers(folder)
        except NvmlUnavailable:
            return  # no NVML here: nothing to wait on
        self.baseline = wait_idle(reader, self.baseline, timeout_s=self.settings.idle_timeout_s,
                                  poll_s=0.25)

    def _lifetime(self, label: str, name: str, index: int, pending: list[Planned],
                  state: KwargSetState, progress: Progress) -> tuple[list[Planned], bool]:
        """One runner process over the pending requests; returns those it did not get to, and
        whether it ended because a request failed (upstream's engine closes then: the runner
        ends by plan, not by a fault)."""
        folder = self.store.artifacts / name / f"runner-{index + 1}"
        folder.mkdir(parents=True, exist_ok=True)
        args = self._write_inputs(name, folder, pending)
        self._wait_idle(folder)
        env = runner_env(self.cfg, name, self.base_env)
        if self.host.offline_command is None:
            # The pinned venv sees its own packages only, not whatever our environment adds.
            env.pop("PYTHONPATH", None)
            env.pop("PYTHONHOME", None)
        if self.host.memory_file_env:
            env[self.host.memory_file_env] = str(folder / MEMORY_FILE)
        runner = ServerProcess([*self.command, *args], env, folder / "runner.log", None,
                               grace_s=self.settings.grace_s, model_code=self.model_code)
        events = Events(folder / "results.jsonl")
        progress.say(f"[{label}] starting the runner")
        runner.start()
        try:
            if not self._init(label, name, runner, events, state, progress):
                return pending, False
            while pending:
                planned = pending[0]
                waited_from = time.monotonic()
                event, why = self._next(runner, events, self.settings.request_timeout_s)
                if event is not None:
                    _check_result(event, planned, events.path)
                record = (self._record(name, planned, event, index) if event is not None else
                          self._lost(name, planned, index, why, runner.log_path,
                                     time.monotonic() - waited_from))
                pending.pop(0)
                progress.step(f"[{label}] {planned.fixture.id} seed {planned.seed}: "
                              f"{record.outcome} {record.wall_s:.2f} s"
                              + (f", output {record.quality}" if record.outcome == "ok" else "")
                              + (f" (tried to allocate {record.oom.requested})"
                                 if record.oom and record.oom.requested else "")
                              + ("" if event is not None else " (runner lost: restarting)"))
                if event is None:
                    return pending, False
                if event["outcome"] != "ok":
                    runner.wait_exit(self.settings.grace_s)
                    if pending:
                        progress.say(f"[{label}] the engine closed on the failed request: a "
                                     f"fresh runner for the {len(pending)} left")
                    return pending, True
            runner.wait_exit(self.settings.grace_s)  # let the engine shut down on its own
            return pending, False
        finally:
            runner.stop()
            redact_file(runner.log_path)
            state.logs.append(file_ref(runner.log_path, self.store.project.artifacts_dir))

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

    def _init(self, label: str, name: str, runner: ServerProcess, events: Events,
              state: KwargSetState, progress: Progress) -> bool:
        """Wait for the engine; on failure set state.failure and return False."""
        event, why = self._next(runner, events, self.settings.ready_timeout_s)
        elapsed = round(time.monotonic() - runner.started, 2)
        if event is not None and event["event"] != "init":
            raise RunnerProtocolError(f"{events.path}: expected the init result, got {event}")
        if event is not None and event.get("outcome") == "ready":
            if state.init_s is None:
                state.init_s = event.get("wall_s")
            progress.say(f"[{label}] engine built after {event.get('wall_s')} s")
            return True
        if event is not None:
            text = event.get("traceback") or event.get("error") or ""
            if not is_oom(text):
                # Upstream reports a worker's death as "Orchestrator initialization failed";
                # the CUDA OOM text is only in the worker's log, which is the runner's log.
                text = runner.log_path.read_text(errors="replace")
            oom = (parse_oom(text, "init", self.model_code)
                   if event.get("outcome") == "oom" or is_oom(text) else None)
            failure = OfflineRun(kwarg_set=name, outcome="init-oom" if oom else "init-error",
                                 quality="unchecked", oom=oom, init_s=event.get("wall_s"),
                                 note=redact_text(event.get("error") or "")[:500] or None)
        elif why == "timeout":
            failure = OfflineRun(kwarg_set=name, outcome="timeout", quality="unchecked",
                                 note=f"the engine was not built within "
                                      f"{self.settings.ready_timeout_s:g} s")
        else:
            code = runner.returncode()
            init = classify_exit(code if code is not None else -1,
                                 runner.log_path.read_text(errors="replace"), elapsed,
                                 self.model_code)
            failure = OfflineRun(kwarg_set=name, quality="unchecked", oom=init.oom,
                                 outcome="init-oom" if init.outcome == "oom" else "init-error",
                                 note=init.note)
        state.failure = failure
        progress.say(f"[{label}] the engine was not built: {failure.outcome}"
                     + (f" ({failure.note})" if failure.note else ""))
        return False

    # --- records ----------------------------------------------------------------------------

    def _add(self, fields: dict) -> OfflineRequest:
        """Write the record (its error redacted), and only then hold it as recorded."""
        if fields.get("error"):
            fields = {**fields, "error": redact_text(fields["error"])}
        record = OfflineRequest.model_validate(fields)
        write_section(self.store.folder, "offline-requests.json", [*self.records, record])
        self.records.append(record)
        return record

    def _record(self, name: str, planned: Planned, event: dict, index: int) -> OfflineRequest:
        fields = {"kwarg_set": name, "fixture": planned.fixture.id,
                  "inputs": planned.fixture.inputs, "seed": planned.seed,
                  "outcome": event.get("outcome"), "quality": "unchecked",
                  "wall_s": event.get("wall_s"), "peak_mib": event.get("peak_mib"),
                  "peak_source": event.get("peak_source"),
                  "started_s": event.get("started_s"), "lifetime": index}
        if event.get("outcome") == "ok":
            fields.update(self._image(self.store.artifacts / name / "images" / f"{planned.id}.png"))
        else:
            text = event.get("traceback") or event.get("error") or ""
            if event.get("outcome") == "oom" or is_oom(text):
                fields.update(outcome="oom", oom=parse_oom(text, "request", self.model_code))
            fields["error"] = (event.get("error") or "no message")[:500]
        return self._add(fields)

    def _image(self, path: Path) -> dict:
        """The output's hashes, metrics and quality; an error when it is no readable image."""
        try:
            data = path.read_bytes()
            pixels = load_pixels(path)
        except (OSError, UnreadableImage) as exc:
            return {"outcome": "error", "error": f"the runner's image is unreadable: {exc}"}
        metrics = measure(pixels, self.cfg.quality)
        return {"output_sha256": sha256_bytes(data), "pixels_sha256": pixels_sha256(pixels),
                "artifact": str(path.relative_to(self.store.project.artifacts_dir)),
                "image": metrics, "quality": quality_of(metrics)}

    def _lost(self, name: str, planned: Planned, index: int, why: str | None, log_path: Path,
              waited_s: float) -> OfflineRequest:
        """A request the runner never answered: it hung (timeout) or died."""
        fields = {"kwarg_set": name, "fixture": planned.fixture.id,
                  "inputs": planned.fixture.inputs, "seed": planned.seed, "quality": "unchecked",
                  "lifetime": index, "wall_s": round(waited_s, 4)}
        if why == "timeout":
            fields.update(outcome="timeout",
                          error=f"no result within {self.settings.request_timeout_s:g} s")
            return self._add(fields)
        log = _after_last_event(log_path.read_text(errors="replace"))
        oom = parse_oom(log, "request", self.model_code)
        fields.update(outcome="oom" if oom else "error", oom=oom,
                      error=f"the runner {why} during the request; its log ends: "
                            f"{log_tail(log)}")
        return self._add(fields)


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


def settings_from(options: OfflineOptions, cfg: HostsConfig) -> OfflineSettings:
    serve = cfg.serve
    return OfflineSettings(
        model=options.model or cfg.stack.model_repo,
        ready_timeout_s=options.ready_timeout_s or serve.ready_timeout_s,
        request_timeout_s=options.request_timeout_s or serve.request_timeout_s,
        grace_s=serve.stop_grace_s if options.grace_s is None else options.grace_s,
        idle_timeout_s=options.idle_timeout_s, kwarg_sets=options.kwarg_sets,
        fixtures=options.fixtures, seeds=options.seeds)


class OfflineSession(Session):
    """probe-offline: every invocation writes a new attempt (`-offline`)."""

    def __init__(self, options: OfflineOptions, command: list[str], *,
                 readers: ReaderFactory | None = None, nvml=None):
        self.options, self.command, self.readers, self.nvml = options, command, readers, nvml

    def prepare(self, ctx: Context) -> None:
        self.settings = settings = settings_from(self.options, ctx.cfg)
        self.kwarg_sets, self.refused = check_kwarg_sets(ctx.cfg, ctx.host_name, ctx.host,
                                                         settings.kwarg_sets)
        fixtures = serve_fixtures(ctx.suite, ctx.host, settings.fixtures)
        check_references(fixtures, ctx.project.fixtures_file.parent,
                         max_pixels=ctx.cfg.probe.max_reference_pixels)
        seeds = settings.seeds or tuple(ctx.suite.sampling.seeds)
        self.plan = [Planned(f, s) for f in fixtures for s in seeds]
        self.runner = runner_command(ctx.cfg, ctx.project, ctx.host_name, self.options.venv,
                                     nvml=self.nvml, out=ctx.out)

    def open_attempt(self, ctx: Context) -> AttemptStore:
        return new_attempt(ctx.project, ctx.host_name, ctx.host, self.command,
                           suffix=ATTEMPT_SUFFIX, what="probe-offline")

    def run(self, ctx: Context, store: AttemptStore) -> int:
        out = ctx.out
        for line in self.refused:
            print(f"refused: {line}", file=out)
        probe = OfflineProbe(ctx.cfg, ctx.suite, ctx.project.fixtures_file.parent, ctx.host_name,
                             store, self.settings, self.runner, out=out,
                             readers=self.readers or default_readers(ctx.host,
                                                                     self.options.gpu_index))
        probe.run(self.kwarg_sets, self.plan)
        checks = offline_checks(ctx.cfg, self.kwarg_sets, probe.records)
        if checks:
            write_section(store.folder, "propagation.json", checks)
        for check in checks:
            print(describe(check), file=out)
        for name in unchecked_extras(ctx.cfg, self.kwarg_sets):
            print(f"not checked: whether {name}'s extras reach the model; no kwarg set run "
                  "beside it has its kwargs without them", file=out)
        print(f"attempt {store.meta.id}: evidence in {store.folder.relative_to(ctx.project.root)}, "
              f"artifacts in {store.artifacts}", file=out)
        for line in self.refused + probe.unfinished:
            print(f"not done: {line}", file=out)
        return 1 if probe.unfinished else 0

    def close(self) -> None:
        """Nothing beyond the attempt: each record is written as it is made."""

    def interrupted(self, store: AttemptStore) -> str:
        return f"the runner was stopped; attempt {store.meta.id} holds what finished"


def run_offline(project: Project, options: OfflineOptions, *, command: list[str],
                readers: ReaderFactory | None = None, nvml=None, out: TextIO | None = None) -> int:
    """The probe-offline command: 0 when every planned request was recorded.

    `command` is the command line recorded as the attempt's provenance; `nvml` stands in for
    pynvml in a real host's env checks, as for the probe."""
    return run_session(project, OfflineSession(options, command, readers=readers, nvml=nvml),
                       options.host, out)
