"""probe-offline's runner supervision and records: generate the fixtures with an offline engine
per entry of the host's offline matrix (vLLM-Omni's `Omni(...)` per offline kwarg set, or on a
Diffusers host the Diffusers pipeline per Diffusers profile). The session around it is
harness/offline_session.py; what it runs, harness/offline_plan.py; the runner's Python and the
attempt's environment, harness/offline_env.py; its results file, harness/runner_events.py.

Each entry runs the runner script (omniprobe/harness/offline_runner.py) with the host's pinned venv
python (or the host's offline_command), in its own process group under omniprobe.harness.supervise,
like the server, sampled like the server (its process tree's GPU memory, a timeline per runner) and,
on an emulated host, capped like it (the startup hook, `--caps` to sweep, the tree guard). The
runner writes one JSON line per request; the one recorder makes each an OfflineRequest in
offline-requests.json (OOM parsed from the exception's text, the image measured and gated as
serve's are, random weights never gated), and each entry and fixture an OfflineCell in offline.json.
A kwarg set that is another's plus one setting gets a propagation check against it, as serve's
deploy configs do. A failed request ends an Omni runner (upstream's engine closes on one) and the
rest get a fresh runner; a Diffusers pipeline survives it. Only a lost runner counts as a restart.
A re-run resumes the newest offline attempt made in the same environment (`--fresh`: a new one).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from omniprobe.analysis.failure_cause import classify_failure
from omniprobe.analysis.oom import is_oom, parse_oom
from omniprobe.analysis.summaries import cell_outcome, cell_structure
from omniprobe.atomic import write_text_atomic
from omniprobe.config.fixtures import FixtureSuite
from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.attempts import AttemptStore, file_ref
from omniprobe.evidence.files import write_section
from omniprobe.evidence.models.common import FailureCause
from omniprobe.evidence.models.offline import OfflineCell, OfflineRequest
from omniprobe.evidence.quantities import Range
from omniprobe.harness.client import reference_path
from omniprobe.harness.emulation import (
    EmulationGuard,
    EmulationUnguarded,
    capped_processes,
    emulation_env,
)
from omniprobe.harness.host_memory import oom_kill_count
from omniprobe.harness.host_ram_cap import HostRamCap
from omniprobe.harness.interrupt import pause
from omniprobe.harness.lifetime import (
    MEMORY_FILE,
    ReaderFactory,
    SamplerDied,
    host_ram_failure,
    timeline_summary,
)
from omniprobe.harness.logs import log_tail, read_from
from omniprobe.harness.offline_env import runner_env
from omniprobe.harness.offline_matrix import OfflineEntry
from omniprobe.harness.offline_plan import (
    OfflineSettings,
    PlannedRequest,
)
from omniprobe.harness.offline_state import EntryState, init_settled
from omniprobe.harness.progress import Progress
from omniprobe.harness.recorder import record_request
from omniprobe.harness.runner_events import (
    RESULT_MEASURES,
    RunnerEvents,
    RunnerProtocolError,
    after_last_event,
    build_facts,
    check_result,
)
from omniprobe.harness.sampler import MIB, GpuReader, NvmlUnavailable, Sampler, wait_idle
from omniprobe.harness.server import SupervisedProcess, classify_exit, no_space_cause
from omniprobe.redaction import redact_file, redact_text

ATTEMPT_SUFFIX = "-offline"


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
        self.runs: list[OfflineCell] = list(store.offline)
        self.unfinished: list[str] = []
        self.environment_failures: list[str] = []

    def run(self, entries: list[OfflineEntry], plans: dict[str, list[PlannedRequest]]) -> None:
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
            rows = [r for r in self.runs if r.configuration == entry.name]
            if init_settled(rows, self.store.accept_timeouts):
                progress.say(f"[{entry.name}] skipped: its init "
                             f"{next(r.outcome for r in rows if r.fixture is None)} is recorded")
                continue
            if todo[entry.name]:
                self._entry(f"{entry.name} {number}/{len(entries)}", entry, todo[entry.name],
                            progress, rows)

    def _pending(self, name: str, plan: list[PlannedRequest]) -> list[PlannedRequest]:
        done = {(r.fixture, r.seed) for r in self.records if r.configuration == name}
        return [p for p in plan if (p.fixture.id, p.seed) not in done]

    # --- one entry --------------------------------------------------------------------------

    def _entry(self, label: str, entry: OfflineEntry, pending: list[PlannedRequest],
               progress: Progress, rows: list[OfflineCell]) -> None:
        if entry.engine == "diffusers":
            self.store.put_profile_settings(entry.name, entry.kwargs["profile"])
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
                elif not init_settled([state.failure], self.store.accept_timeouts):
                    timed_out = state.failure.outcome == "timeout"  # not the card's answer
                    (self.unfinished if timed_out else self.environment_failures).append(
                        f"{entry.name}: init {state.failure.outcome}: " + (
                            state.failure.note if timed_out else state.failure.cause.reason))
                break
            if closed:
                continue  # the engine closed on a failed request, as upstream's does: planned
            if restarts >= self.settings.max_restarts:
                self.unfinished.append(f"{entry.name}: {len(pending)} request(s) not run after "
                                       f"{restarts} restart(s); re-run to try them again")
                break
            restarts += 1
        self.runs = [r for r in self.runs if r.configuration != entry.name] + self._summary(entry,
                                                                                            state)
        write_section(self.store.folder, "offline.json", self.runs)

    def _summary(self, entry: OfflineEntry, state: EntryState) -> list[OfflineCell]:
        """The init failure, if any, then one row per fixture in the order they ran."""
        shared = {"logs": list(state.logs), "timelines": list(state.timelines),
                  "build": state.build, "host_ram": list(state.host_ram)}
        rows = [state.failure.model_copy(update=shared)] if state.failure else []
        name = entry.name
        records = [r for r in self.records if r.configuration == name]
        for fixture in dict.fromkeys(r.fixture for r in records):
            mine = [r for r in records if r.fixture == fixture]
            walls = [r.wall_s for r in mine if r.outcome == "ok"]
            rows.append(OfflineCell(
                **entry.named, fixture=fixture, seeds=sorted({r.seed for r in mine}),
                outcome=cell_outcome([r.outcome for r in mine]), structure=cell_structure(mine),
                oom=next((r.oom for r in mine if r.oom is not None), None),
                wall_s=Range.of(walls) if walls else None, init_s=state.init_s, **shared))
        return rows

    # --- one runner process -----------------------------------------------------------------

    def request_spec(self, entry: OfflineEntry, planned: PlannedRequest, output: Path) -> dict:
        """One request as the runner protocol has it."""
        steps, guidance, _ = entry.sampling(self.suite.sampling)
        fixture = planned.fixture
        return {"id": planned.id, "fixture": fixture.id, "seed": planned.seed,
                "prompt": fixture.prompt, "width": fixture.width, "height": fixture.height,
                "references": [str(reference_path(fixture, r, self.fixtures_dir))
                               for r in fixture.references or []],
                "num_inference_steps": steps, "true_cfg_scale": guidance, "output": str(output)}

    def runner_args(self, entry: OfflineEntry, folder: Path, work: str, spec: dict) -> list[str]:
        """The runner's arguments; its kwargs and work (`--requests`, `--search`) beside its log."""
        write_text_atomic(folder / "kwargs.json", json.dumps(entry.kwargs, indent=2) + "\n")
        write_text_atomic(folder / f"{work}.json", json.dumps(spec, indent=2))
        engine = [] if entry.engine == "omni" else ["--engine", entry.engine]
        return [*engine, "--model", self.settings.model,
                "--kwargs-file", str(folder / "kwargs.json"),
                f"--{work}", str(folder / f"{work}.json"),
                "--results", str(folder / "results.jsonl")]

    def _write_inputs(self, entry: OfflineEntry, folder: Path, pending: list[PlannedRequest]) -> list[str]:
        images = self.store.artifacts / entry.name / "images"
        images.mkdir(parents=True, exist_ok=True)
        requests = [self.request_spec(entry, p, images / f"{p.id}.png") for p in pending]
        return self.runner_args(entry, folder, "requests", {"requests": requests})

    def _reader(self, folder: Path) -> tuple[GpuReader | None, str | None]:
        try:
            return self.readers(folder), None
        except NvmlUnavailable as exc:
            return None, str(exc)

    def _lifetime(self, label: str, entry: OfflineEntry, index: int, pending: list[PlannedRequest],
                  state: EntryState, progress: Progress) -> tuple[list[PlannedRequest], bool]:
        """One runner process over the pending requests; returns those it did not get to, and
        whether it ended because a request failed (upstream's engine closes then: the runner
        ends by plan, not by a fault)."""
        folder = self.store.artifacts / entry.name / f"runner-{index + 1}"
        folder.mkdir(parents=True, exist_ok=True)
        args = self._write_inputs(entry, folder, pending)
        with self._running(label, entry, index, folder, args, state, progress) as running:
            if running is None:
                return pending, False
            runner, events, guard, host_ram = running
            while pending:
                planned = pending[0]
                waited_from = time.monotonic()
                event, why = self._next(runner, events, self.settings.request_timeout_s)
                if event is not None:
                    check_result(event, planned, events.path)
                elif why == "exited 0":
                    raise RunnerProtocolError(
                        f"{events.path}: the runner exited 0 without the result of "
                        f"{planned.id!r}: expected a 'request' event for every request it was "
                        "given; the runner broke the protocol")
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
                              + (f", output {record.structure}" if record.outcome == "ok" else "")
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

    @contextmanager
    def _running(self, label: str, entry: OfflineEntry, index: int, folder: Path,
                 args: list[str], state: EntryState, progress: Progress
                 ) -> Iterator[tuple[SupervisedProcess, RunnerEvents, EmulationGuard | None,
                                     Callable[[int | None, str], FailureCause | None]] | None]:
        """One runner process, started with `args`, sampled, capped and guarded like the server,
        waited for until its engine is built: yields (the runner, its events, the guard, the
        host-RAM cause of a death), or None when the build failed (state.failure says how).
        On leaving, the runner is stopped and its timeline, host RAM and log are kept."""
        name = entry.name
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
        runner = SupervisedProcess(command, env, folder / "runner.log", None,
                                   grace_s=self.settings.grace_s, model_code=self.model_code)
        # A discarded attempt's runner of the same name left its results: never read as ours.
        (folder / "results.jsonl").unlink(missing_ok=True)
        events = RunnerEvents(folder / "results.jsonl")
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
                yield None
            else:
                yield runner, events, guard, host_ram
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

    def _next(self, runner: SupervisedProcess, events: RunnerEvents,
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

    def _init(self, label: str, entry: OfflineEntry, runner: SupervisedProcess, events: RunnerEvents,
              state: EntryState, progress: Progress,
              host_ram: Callable[[int | None, str], FailureCause | None]) -> bool:
        """Wait for the engine; on failure set state.failure and return False. `host_ram`:
        (exit status, log) -> the host's cause of a runner the kernel killed for host RAM."""
        event, why = self._next(runner, events, self.settings.ready_timeout_s)
        elapsed = round(time.monotonic() - runner.started, 2)
        if event is not None and event["event"] != "init":
            raise RunnerProtocolError(f"{events.path}: expected the init result, got {event}")
        if why == "exited 0":
            # A runner ends well only after its init event: no results is no answer of the card.
            raise RunnerProtocolError(f"{events.path}: the runner exited 0 without its 'init' "
                                      "event: expected the init result first; the runner broke "
                                      "the protocol")
        if event is not None and event.get("outcome") == "ready":
            build = build_facts(event, events.path)
            refused = self._refuse_ready(entry, event)
            if refused is None:
                if state.init_s is None:
                    state.init_s = event.get("wall_s")
                state.survives_failure = bool(event.get("survives_failure"))
                if build is not None:
                    state.build = build
                progress.say(f"[{label}] engine built after {event.get('wall_s')} s")
                return True
            failure = OfflineCell(**entry.named, outcome="init-error", structure="unchecked",
                                 init_s=event.get("wall_s"), note=refused.reason, cause=refused)
        elif event is not None:
            text = reported = event.get("traceback") or event.get("error") or ""
            if not is_oom(text):
                # Upstream reports a worker's death as "Orchestrator initialization failed";
                # the CUDA OOM text is only in the worker's log, which is the runner's log.
                text = read_from(runner.log_path)
            oom = (parse_oom(text, "init", self.model_code)
                   if event.get("outcome") == "oom" or is_oom(text) else None)
            failure = OfflineCell(**entry.named, outcome="init-oom" if oom else "init-error",
                                 structure="unchecked", oom=oom, init_s=event.get("wall_s"),
                                 note=redact_text(event.get("error") or "")[:500] or None,
                                 # Else the engine's own traceback (a Diffusers build's).
                                 cause=(classify_failure(text, self.model_code)
                                        or classify_failure(reported, self.model_code)))
        elif why == "timeout":
            failure = OfflineCell(**entry.named, outcome="timeout", structure="unchecked",
                                 note=f"the engine was not built within "
                                      f"{self.settings.ready_timeout_s:g} s")
        else:
            code = runner.returncode()
            log = read_from(runner.log_path)
            init = classify_exit(code if code is not None else -1, log, elapsed, self.model_code)
            # The kernel may have killed it for host RAM: the host's answer.
            cause = host_ram(code, log) or init.cause or no_space_cause(runner.log_path.parent)
            killed = cause is not None and cause.kind == "host"  # its reason, not the last line
            failure = OfflineCell(**entry.named, structure="unchecked", oom=init.oom,
                                 outcome="init-oom" if init.outcome == "oom" else "init-error",
                                 note=f"exited {code}: {cause.reason}" if killed else init.note,
                                 cause=cause)
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

    def _fields(self, entry: OfflineEntry, planned: PlannedRequest, index: int, breach) -> dict:
        steps, guidance, whose = entry.sampling(self.suite.sampling)
        return {**entry.named, "fixture": planned.fixture.id,
                "inputs": planned.fixture.inputs, "seed": planned.seed, "structure": "unchecked",
                "lifetime": index, "emulation_breach": breach,
                "engine": None if entry.engine == "omni" else entry.engine,
                "weights": entry.weights, "num_inference_steps": steps,
                "true_cfg_scale": guidance, "sampling_from": whose}

    def _record(self, entry: OfflineEntry, planned: PlannedRequest, event: dict, index: int,
                breach) -> OfflineRequest:
        measured = event.get("measured") or {}
        fields = {**self._fields(entry, planned, index, breach),
                  "outcome": event.get("outcome"), "wall_s": event.get("wall_s"),
                  "peak_mib": event.get("peak_mib"), "peak_source": event.get("peak_source"),
                  "started_s": event.get("started_s"),
                  **{k: v for k, v in measured.items() if k in RESULT_MEASURES}}
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
            checks=self.cfg.structure, save=False, unreadable="the runner's image is unreadable"))

    def _lost(self, entry: OfflineEntry, planned: PlannedRequest, index: int, why: str | None,
              log_path: Path, waited_s: float, breach,
              host_ram: Callable[[str], FailureCause | None]) -> OfflineRequest:
        """A request the runner never answered: it hung (timeout) or died; `host_ram` reads a
        death of host RAM off its log and the signs it left (probe.host_ram_failure)."""
        fields = {**self._fields(entry, planned, index, breach), "wall_s": round(waited_s, 4)}
        if why == "timeout":
            fields.update(outcome="timeout",
                          error=f"no result within {self.settings.request_timeout_s:g} s")
            return self._add(OfflineRequest.model_validate(fields))
        log = after_last_event(read_from(log_path))
        oom = parse_oom(log, "request", self.model_code)
        fields.update(outcome="oom" if oom else "error", oom=oom,
                      cause=host_ram(log) or classify_failure(log, self.model_code),
                      error=redact_text(f"the runner {why} during the request; its log ends: "
                                        f"{log_tail(log)}"))
        return self._add(OfflineRequest.model_validate(fields))


