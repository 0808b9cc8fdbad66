"""One runner process's lifetime, the same for both kinds of work a runner does: the requests of
probe-offline (probe.py) and the trials of a capacity search (capacity.py).

A lifetime is the runner started with its arguments (its kwargs and work beside its log, in the
protocol's JSON), under a host-RAM cgroup where the host caps its RAM, through the one supervised
lifetime servers run through too (harness/common/lifetime.py: its own process group, sampled, a
timeline, stopped on every exit path), and waited for until its engine is built; the init event
is checked (an uncapped emulation, an allocator setting its torch ignored, a component of the
wrong size) before any work is handed over. Each kind of work then reads the runner's events
through `next_event` and records them itself.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from omniprobe.atomic import write_text_atomic
from omniprobe.classify.failure_cause import classify_failure
from omniprobe.classify.oom import is_oom, parse_oom
from omniprobe.config.fixtures import FixtureSuite
from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.attempts import AttemptStore
from omniprobe.evidence.models.common import FailureCause
from omniprobe.evidence.models.offline import INIT_FAILED, RunnerLifetime
from omniprobe.evidence.models.runs import InitResult
from omniprobe.harness.common.emulation import EmulationGuard
from omniprobe.harness.common.host_memory import oom_kill_count
from omniprobe.harness.common.interrupt import pause
from omniprobe.harness.common.lifetime import Ended, Lifetimes, ProcessSpec, ReaderFactory
from omniprobe.harness.common.logs import read_from
from omniprobe.harness.common.process import SupervisedProcess, classify_exit, no_space_cause
from omniprobe.harness.common.progress import Progress
from omniprobe.harness.common.references import reference_path
from omniprobe.harness.offline.env import runner_env
from omniprobe.harness.offline.host_ram_cap import HostRamCap
from omniprobe.harness.offline.matrix import OfflineEntry
from omniprobe.harness.offline.plan import OfflineSettings, PlannedRequest
from omniprobe.harness.offline.runner_events import (
    RunnerEvents,
    RunnerProtocolError,
    build_facts,
)
from omniprobe.harness.offline.state import EntryState
from omniprobe.redaction import redact_text
from omniprobe_engine.protocol import RequestSpec

# (the runner, its events, the emulation guard, the host-RAM cause of a death)
Running = tuple[SupervisedProcess, RunnerEvents, EmulationGuard | None,
                Callable[[int | None, str], FailureCause | None]]


class RunnerSupervisor:
    """Starts, caps, samples and stops the host's runner, one lifetime at a time; owns nothing
    the work records (each kind of work writes its own records through the attempt store)."""

    def __init__(self, cfg: HostsConfig, suite: FixtureSuite, fixtures_dir: Path, host_name: str,
                 store: AttemptStore, settings: OfflineSettings, command: list[str], *,
                 readers: ReaderFactory, base_env: dict[str, str] | None = None,
                 out: TextIO = sys.stderr):
        self.cfg, self.suite, self.fixtures_dir = cfg, suite, fixtures_dir
        self.host_name, self.host = host_name, cfg.host(host_name)
        self.store, self.settings, self.command, self.out = store, settings, command, out
        self.lifetimes = Lifetimes(host_name, self.host, settings, readers,
                                   store.project.artifacts_dir)
        self.model_code = tuple(self.host.model_code)
        self.base_env = dict(os.environ if base_env is None else base_env)

    def request_spec(self, entry: OfflineEntry, planned: PlannedRequest,
                     output: Path) -> RequestSpec:
        """One request as the runner protocol has it."""
        steps, guidance, _ = entry.sampling(self.suite.sampling)
        fixture = planned.fixture
        return RequestSpec(
            id=planned.id, fixture=fixture.id, seed=planned.seed, prompt=fixture.prompt,
            width=fixture.width, height=fixture.height,
            reference_paths=[str(reference_path(fixture, r, self.fixtures_dir))
                             for r in fixture.references or []],
            num_inference_steps=steps, true_cfg_scale=guidance, output=str(output))

    def runner_args(self, entry: OfflineEntry, folder: Path, work: str, spec: dict) -> list[str]:
        """The runner's arguments; its kwargs and work (--requests, --search: the JSON of
        protocol.py's specs) beside its log."""
        write_text_atomic(folder / "kwargs.json", json.dumps(entry.kwargs, indent=2) + "\n")
        write_text_atomic(folder / f"{work}.json", json.dumps(spec, indent=2))
        engine = [] if entry.engine == "omni" else ["--engine", entry.engine]
        return [*engine, "--model", self.settings.model,
                "--kwargs-file", str(folder / "kwargs.json"),
                f"--{work}", str(folder / f"{work}.json"),
                "--results", str(folder / "results.jsonl")]

    @contextmanager
    def running(self, label: str, entry: OfflineEntry, index: int, folder: Path,
                 args: list[str], state: EntryState, progress: Progress
                 ) -> Iterator[Running | None]:
        """One runner lifetime (harness/common/lifetime.py), started with `args` and waited for
        until its engine is built: yields (the runner, its events, the guard, the host-RAM cause
        of a death), or None when the build failed (state.failure says how). On leaving, its
        timeline, host RAM and log are kept in `state`."""
        env = runner_env(self.cfg, entry, self.base_env,
                         self.store.meta.environment.allocator_variable
                         if self.store.meta.environment else None)
        if self.host.offline_command is None:
            # The pinned venv sees its own packages only, not whatever our environment adds.
            env.pop("PYTHONPATH", None)
            env.pop("PYTHONHOME", None)
        # A discarded attempt's runner of the same name left its results: never read as ours.
        (folder / "results.jsonl").unlink(missing_ok=True)
        events = RunnerEvents(folder / "results.jsonl")
        with self._host_ram_cap(entry.name, index) as ram:
            command = [*self.command, *args]
            # An emulated host RAM cap's cgroup is no descendant of ours: its own count tells,
            # and a cgroup made a moment ago has killed nothing yet.
            spec = ProcessSpec(command if ram is None else ram.wrap(command, sys.executable),
                               env, folder / "runner.log", "runner", entry.name,
                               f"runner {index}", redact=(events.path,),
                               oom_kills=oom_kill_count if ram is None else ram.oom_kills,
                               fresh_cgroup=ram is not None)

            def keep(end: Ended) -> None:
                state.lifetimes.append(RunnerLifetime(
                    log=end.log, timeline=end.timeline,
                    host_ram=ram.check() if ram is not None else None, closed=state.closed))
                state.closed = None

            progress.say(f"[{label}] starting the runner")
            with self.lifetimes.run(spec, keep) as running:
                if not self._init(label, entry, running.process, events, state, progress,
                                  running.host_ram):
                    yield None
                else:
                    yield running.process, events, running.guard, running.host_ram

    @contextmanager
    def _host_ram_cap(self, name: str, index: int) -> Iterator[HostRamCap | None]:
        """The cgroup that caps an emulated host's RAM for one runner, removed however it ends."""
        if self.settings.host_ram_mib is None:
            yield None
            return
        ram = HostRamCap.create(f"omniprobe-{self.store.meta.id}-{name}-{index + 1}",
                                self.settings.host_ram_mib)
        try:
            yield ram
        finally:
            ram.remove()

    def next_event(self, runner: SupervisedProcess, events: RunnerEvents,
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
        event, why = self.next_event(runner, events, self.settings.ready_timeout_s)
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
            failure = InitResult(outcome="error", time_s=event.get("wall_s"),
                                 note=refused.reason, cause=refused)
        elif event is not None:
            text = reported = event.get("traceback") or event.get("error") or ""
            if not is_oom(text):
                # Upstream reports a worker's death as "Orchestrator initialization failed";
                # the CUDA OOM text is only in the worker's log, which is the runner's log.
                text = read_from(runner.log_path)
            oom = (parse_oom(text, "init", self.model_code)
                   if event.get("outcome") == "oom" or is_oom(text) else None)
            failure = InitResult(outcome="oom" if oom else "error",
                                 oom=oom, time_s=event.get("wall_s"),
                                 note=redact_text(event.get("error") or "")[:500] or None,
                                 # Else the engine's own traceback (a Diffusers build's).
                                 cause=(classify_failure(text, self.model_code)
                                        or classify_failure(reported, self.model_code)))
        elif why == "timeout":
            failure = InitResult(outcome="timeout",
                                 note=f"the engine was not built within "
                                      f"{self.settings.ready_timeout_s:g} s")
        else:
            code = runner.returncode()
            log = read_from(runner.log_path)
            init = classify_exit(code if code is not None else -1, log, elapsed, self.model_code)
            # The kernel may have killed it for host RAM: the host's answer.
            cause = host_ram(code, log) or init.cause or no_space_cause(runner.log_path.parent)
            killed = cause is not None and cause.kind == "host"  # its reason, not the last line
            failure = InitResult(oom=init.oom,
                                 outcome="oom" if init.outcome == "oom" else "error",
                                 note=f"exited {code}: {cause.reason}" if killed else init.note,
                                 cause=cause)
        state.failure = failure
        progress.say(f"[{label}] the engine was not built: {INIT_FAILED[failure.outcome]}"
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
