"""The probe-init / probe-serve session: which attempt it writes, and its run per cap."""

from __future__ import annotations

from dataclasses import replace
from typing import TextIO

from omniprobe.config.fixtures import FixtureNotRunnable
from omniprobe.config.hosts import load_hosts
from omniprobe.config.project import Project
from omniprobe.config.selection import (
    resolve_host,
)
from omniprobe.env.serve_command import (
    flag_set_refusal,
)
from omniprobe.evidence.attempts import AttemptStore, open_probe_attempt, probe_attempts
from omniprobe.evidence.files import parse_file
from omniprobe.evidence.models.runs import ServeRun
from omniprobe.harness.common.leftover import stop_leftovers
from omniprobe.harness.common.lifetime import (
    ReaderFactory,
    default_readers,
)
from omniprobe.harness.common.options import ProbeOptions, settings_of
from omniprobe.harness.common.plan import (
    attempt_complete,
    earlier_attempts,
    pace,
    settled_exit,
    unsettled,
)
from omniprobe.harness.common.probe_env import prepare_env
from omniprobe.harness.common.process import require_port_free
from omniprobe.harness.common.references import require_references
from omniprobe.harness.common.selection import probe_caps, serve_fixtures
from omniprobe.harness.common.session import Context, Session, close_attempt, open_run_attempt, run_session
from omniprobe.harness.serve.plan import ServeSettings, select_flag_sets
from omniprobe.harness.serve.probe import ServeProbe


def resumable_runs(project: Project, host_name: str, cap_mib: int | None) -> list[ServeRun]:
    """The runs of the host's newest probe attempt (of the cap), the one a resume would take."""
    existing = probe_attempts(project.evidence_dir / host_name, cap_mib)
    runs = existing[-1] / "runs.json" if existing else None
    return parse_file(runs) if runs is not None and runs.is_file() else []


class ProbeSession(Session):
    """probe-init or probe-serve, the session `name`: resumes the host's newest probe attempt,
    or with --fresh starts one (once per nox invocation: the sessions after join it)."""

    def __init__(self, name: str, options: ProbeOptions, command: list[str], *,
                 readers: ReaderFactory | None = None, nvml=None, cap_mib: int | None = None):
        self.name, self.options, self.command = name, options, command
        self.readers, self.nvml, self.cap_mib = readers, nvml, cap_mib
        self.probe: ServeProbe | None = None

    def prepare(self, ctx: Context) -> None:
        self.settings = settings_of(ServeSettings, self.options, ctx.cfg, cap_mib=self.cap_mib)
        select_flag_sets(ctx.host_name, ctx.host, self.settings.flag_sets)
        if self.name == "probe-serve":
            fixtures = serve_fixtures(ctx.suite, ctx.host, self.settings.fixtures)
            require_references(fixtures, ctx.project.fixtures_file.parent,
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
        require_port_free(ctx.cfg.serve.bind_host, self.settings.port)

    def _plan(self, ctx: Context) -> tuple[list[str], list[tuple[str, int]]]:
        """What this run asks of an attempt: its flag sets and every (fixture, seed) cell the
        probe-serve of the same options serves (the defaults where none are named)."""
        try:
            fixtures = [f.id for f in serve_fixtures(ctx.suite, ctx.host, self.settings.fixtures)]
        except FixtureNotRunnable:
            fixtures = []
        # A flag set the run refuses (its deploy config's content is unknown) asks nothing.
        flag_sets = [f for f in select_flag_sets(ctx.host_name, ctx.host, self.settings.flag_sets)
                     if flag_set_refusal(ctx.cfg, f, ctx.project.hosts_file) is None]
        return flag_sets, [(f, s) for f in fixtures for s in ctx.suite.sampling.seeds]

    def open_attempt(self, ctx: Context) -> AttemptStore:
        # One fresh attempt per cap on an emulated host: a sweep's sessions join theirs.
        key = ctx.host_name if self.cap_mib is None else f"{ctx.host_name}@{self.cap_mib}mib"
        flag_sets, cells = self._plan(ctx)
        accept = self.options.accept_timeouts

        def complete(found: AttemptStore) -> bool:
            found.accept_timeouts = accept  # this run's reading of a timeout on record
            return attempt_complete(found, flag_sets, cells)

        store, self.attempt_reason = open_run_attempt(ctx, key, self.options.fresh, lambda fresh_id: (
            open_probe_attempt(
                ctx.project, ctx.host_name, ctx.host, self.command, environment=self.env.record,
                fresh=self.options.fresh, fresh_id=fresh_id, cap_mib=self.cap_mib,
                complete=complete)))
        store.accept_timeouts = accept
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
        probe.attempt_why = self.attempt_reason
        probe.pace = pace(earlier_attempts(ctx.project.evidence_dir / ctx.host_name,
                                           store.meta.id))
        probe.rerun_command = f"nox -s env-{ctx.host_name} {self.name} -- --fresh"
        (probe.probe_init if self.name == "probe-init" else probe.probe_serve)()
        probe.recorder.drain()
        close_attempt(ctx, store, probe.refused + probe.unfinished, probe.environment_failures,
                      "flag set(s)", out)
        # What this session asks for: each flag set it may start (a refused one cannot run, and
        # says so above) and, for probe-serve, every cell under it.
        flag_sets, cells = self._plan(ctx)
        asked = [f for f in flag_sets if f not in probe.refused_flag_sets]
        return settled_exit(unsettled(store, asked, cells if self.name == "probe-serve" else []),
                            out)

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
