"""The probe-offline session: which attempt it writes, and its run per cap."""

from __future__ import annotations

from dataclasses import replace
from typing import TextIO

from omniprobe.config.hosts import load_hosts
from omniprobe.config.project import Project
from omniprobe.config.selection import resolve_host
from omniprobe.errors import Refusal
from omniprobe.evidence.attempts import AttemptStore, open_probe_attempt
from omniprobe.evidence.repeats import standing
from omniprobe.harness.common.lifetime import (
    ReaderFactory,
    default_readers,
)
from omniprobe.harness.common.options import OfflineOptions, settings_of
from omniprobe.harness.common.plan import init_settled, settled_line
from omniprobe.harness.common.propagation_rules import describe, offline_checks, unchecked_extras
from omniprobe.harness.common.references import require_references
from omniprobe.harness.common.selection import probe_caps, serve_fixtures
from omniprobe.harness.common.session import Context, Session, close_attempt, open_run_attempt, run_session
from omniprobe.harness.offline.build_size import build_size_refusal, machine_ram_bytes
from omniprobe.harness.offline.env import offline_environment, runner_command
from omniprobe.harness.offline.host_ram_cap import require_host_ram_cap
from omniprobe.harness.offline.matrix import offline_matrix
from omniprobe.harness.offline.plan import (
    KwargSetNotRunnable,
    OfflineSettings,
    PlannedRequest,
    host_ram_mib,
)
from omniprobe.harness.offline.probe import ATTEMPT_SUFFIX, OfflineProbe
from omniprobe.harness.offline.runner_lifetime import RunnerSupervisor
from omniprobe.harness.offline.state import init_failure


class OfflineSession(Session):
    """probe-offline: resumes the host's newest offline attempt (of the cap) made in this
    environment, or with --fresh starts one (once per nox invocation and cap)."""

    def __init__(self, options: OfflineOptions, command: list[str], *,
                 readers: ReaderFactory | None = None, nvml=None, cap_mib: int | None = None):
        self.options, self.command, self.readers, self.nvml = options, command, readers, nvml
        self.cap_mib = cap_mib

    def prepare(self, ctx: Context) -> None:
        self.settings = settings = settings_of(OfflineSettings, self.options, ctx.cfg,
                                               cap_mib=self.cap_mib,
                                               host_ram_mib=host_ram_mib(ctx.host))
        try:  # the input's refusals first: they hold on any machine
            self.entries, self.refused, configs = offline_matrix(
                ctx.cfg, ctx.project, ctx.host_name, ctx.host, settings.configurations)
        except Refusal as exc:
            raise KwargSetNotRunnable(str(exc)) from None
        if settings.host_ram_mib is not None:
            require_host_ram_cap()  # before any attempt exists
        fixtures = serve_fixtures(ctx.suite, ctx.host, settings.fixtures)
        require_references(fixtures, ctx.project.fixtures_file.parent,
                         max_pixels=ctx.cfg.probe.max_reference_pixels)
        runner = runner_command(ctx.cfg, ctx.project, ctx.host_name, self.options.venv,
                                nvml=self.nvml, out=ctx.out)
        self.runner = runner.argv
        self.environment, facts = offline_environment(ctx, self.options, runner, configs,
                                                       self.entries, nvml=self.nvml,
                                                       host_ram_mib=settings.host_ram_mib)
        size = build_size_refusal(facts.get("parameters") or {}, machine_ram_bytes(),
                                  configs.folder) if configs is not None else None
        if size is not None:
            raise Refusal(size)
        refused = facts.get("refusals") or {}
        if refused:  # the engine's own words, asked of the runner's Python before any runner
            raise Refusal("; ".join(f"Diffusers profile {name!r}: {why}"
                                    for name, why in refused.items()))
        if self.environment.served.source == "pinned":  # the runner loads the snapshot folder
            self.settings = replace(self.settings, model=self.environment.served.model)
        for entry in self.entries:  # a profile's allocator variable is the runner's torch's
            entry.runner_env(self.environment.allocator_variable)
        self.plans = {e.name: [PlannedRequest(f, s) for f in fixtures for s in
                               (settings.seeds or e.seeds or tuple(ctx.suite.sampling.seeds))]
                      for e in self.entries}

    def open_attempt(self, ctx: Context) -> AttemptStore:
        key = f"{ctx.host_name}-offline" + ("" if self.cap_mib is None else f"@{self.cap_mib}mib")
        weights = ctx.host.diffusers.weights if ctx.host.diffusers else None

        def complete(found: AttemptStore) -> bool:
            done = {(r.configuration, r.fixture, r.seed) for r in found.offline_requests
                    if r.settles(self.options.accept_timeouts)}
            settled = {e.name for e in self.entries if init_settled(
                init_failure(found.offline_run(e.name)), self.options.accept_timeouts)}
            return all(e.name in settled or all((e.name, p.fixture.id, p.seed) in done
                                                for p in self.plans[e.name])
                       for e in self.entries)

        store, self.attempt_reason = open_run_attempt(ctx, key, self.options.fresh, lambda fresh_id: (
            open_probe_attempt(
                ctx.project, ctx.host_name, ctx.host, self.command, environment=self.environment,
                fresh=self.options.fresh, fresh_id=fresh_id, cap_mib=self.cap_mib,
                complete=complete, kind=ATTEMPT_SUFFIX, what="probe-offline", weights=weights)))
        store.accept_timeouts = self.options.accept_timeouts
        return store

    def run(self, ctx: Context, store: AttemptStore) -> int:
        out = ctx.out
        print(f"attempt {store.meta.id} ({self.attempt_reason})", file=out)
        for line in self.refused:
            print(f"refused: {line}", file=out)
        probe = OfflineProbe(self.supervisor(ctx, store))
        probe.run(self.entries, self.plans)
        if not self.options.accept_timeouts:  # no answer of the card's: a re-run sends it again
            probe.unfinished += [f"{r.configuration}: {r.fixture} seed {r.seed} timed out, not "
                                 "the card's answer; re-run, or --accept-timeouts"
                                 for r in standing(probe.records) if r.sent_again_on_resume]
        kwarg_sets = [e.name for e in self.entries if e.engine == "omni"]
        checks = offline_checks(ctx.cfg, kwarg_sets, probe.records)
        if checks:
            store.put_propagation(checks)
        for check in checks:
            print(describe(check), file=out)
        for name in unchecked_extras(ctx.cfg, kwarg_sets):
            print(f"not checked: whether {name}'s extras reach the model; no kwarg set run "
                  "beside it has its kwargs without them", file=out)
        close_attempt(ctx, store, self.refused + probe.unfinished, probe.environment_failures,
                      "entries", out)
        print(settled_line(probe.unfinished), file=out)
        return 1 if probe.unfinished else 0

    def supervisor(self, ctx: Context, store: AttemptStore) -> RunnerSupervisor:
        """The runner lifetimes of this session's attempt, sampled on the chosen GPU."""
        return RunnerSupervisor(
            ctx.cfg, ctx.suite, ctx.project.fixtures_file.parent, ctx.host_name, store,
            self.settings, self.runner, out=ctx.out,
            readers=self.readers or default_readers(ctx.host, self.options.gpu_index))

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
