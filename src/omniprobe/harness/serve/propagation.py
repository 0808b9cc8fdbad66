"""The propagation check: does a knob set in a deploy config reach the model through serve?

It serves one fixture and seed under two flag sets of the host, one passing the deploy config
(flag_set_with) and one without it (flag_set_without), and compares the two outputs by bytes and
by decoded pixels (imaging.pixels_sha256). Identical outputs mean the knob never reached the
model. The two server lifetimes, their requests and the check (propagation.json) go to a new
attempt (`-propagation`).

Offline kwarg sets get the same check inside probe-offline (offline_checks): a kwarg set whose
kwargs are another's plus one setting is compared with that twin on the first fixture and seed
both generated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TextIO

from omniprobe.classify.imaging import load_pixels, pixels_sha256
from omniprobe.config.fixtures import Fixture, FixtureSuite
from omniprobe.config.host_entry import Host
from omniprobe.config.hosts import HostsConfig
from omniprobe.config.project import Project
from omniprobe.env.serve_command import server_command
from omniprobe.evidence.attempts import AttemptStore, new_attempt
from omniprobe.evidence.models.outputs import PropagationCheck
from omniprobe.evidence.models.requests import RequestRecord
from omniprobe.harness.common.lifetime import ReaderFactory, default_readers
from omniprobe.harness.common.options import PropagationOptions, settings_of
from omniprobe.harness.common.plan import settled_exit, unsettled
from omniprobe.harness.common.probe_env import prepare_env
from omniprobe.harness.common.process import require_port_free
from omniprobe.harness.common.propagation_rules import describe
from omniprobe.harness.common.quality import resolve_artifact
from omniprobe.harness.common.references import require_references
from omniprobe.harness.common.selection import PlanError, serve_fixtures
from omniprobe.harness.common.session import Context, Session, run_session
from omniprobe.harness.serve.plan import ServeSettings
from omniprobe.harness.serve.probe import ServeProbe

ATTEMPT_SUFFIX = "-propagation"


@dataclass(frozen=True)
class Plan:
    knob: str
    flag_set_with: str
    flag_set_without: str
    fixture: Fixture
    seed: int


def _deploy_flag_sets(cfg: HostsConfig, host: Host) -> list[str]:
    return [f for f in host.serve_flag_sets if cfg.flag_sets[f].deploy_config]


def choose_flag_sets(cfg: HostsConfig, host_name: str, host: Host, with_: str | None,
                     without: str | None) -> tuple[str, str]:
    """The pair to compare. By default the host's one flag set with a deploy config, against its
    one flag set with the same arguments and environment and no deploy config."""
    for name in filter(None, (with_, without)):
        if name not in host.serve_flag_sets:
            raise PlanError(f"flag set {name!r} is not run on host {host_name!r} "
                            f"(its flag sets: {', '.join(host.serve_flag_sets)})")
    if with_ is None:
        candidates = _deploy_flag_sets(cfg, host)
        if len(candidates) != 1:
            raise PlanError(f"host {host_name!r} has {len(candidates)} flag sets with a deploy "
                            f"config ({', '.join(candidates) or 'none'}); name one with --with")
        with_ = candidates[0]
    flags = cfg.flag_sets[with_]
    if not flags.deploy_config:
        raise PlanError(f"flag set {with_!r} passes no deploy config ([flag_sets.{with_}] has no "
                        "'deploy_config'); --with needs one that does")
    if without is None:
        twins = [f for f in host.serve_flag_sets if f != with_
                 and not cfg.flag_sets[f].deploy_config
                 and cfg.flag_sets[f].args == flags.args and cfg.flag_sets[f].env == flags.env]
        if len(twins) != 1:
            raise PlanError(f"host {host_name!r} has {len(twins)} flag sets like {with_!r} "
                            f"without its deploy config ({', '.join(twins) or 'none'}); "
                            "name one with --without")
        without = twins[0]
    if cfg.flag_sets[without].deploy_config == flags.deploy_config:
        raise PlanError(f"flag sets {with_!r} and {without!r} pass the same deploy config "
                        f"{flags.deploy_config!r}: the check needs one without it")
    return with_, without


def choose_knob(cfg: HostsConfig, flag_set_with: str, knob: str | None) -> str:
    name = cfg.flag_sets[flag_set_with].deploy_config
    knob = knob or cfg.deploy_configs[name].knob
    if not knob:
        raise PlanError(f"which knob deploy config {name!r} sets is not recorded: set 'knob' "
                        f"under [deploy_configs.{name}] in hosts.toml, or pass --knob")
    return knob


def choose_case(suite: FixtureSuite, host_name: str, host: Host, fixture: str | None,
                seed: int | None) -> tuple[Fixture, int]:
    """The fixture (default: the edit with the fewest references of those the host serves by
    default) and the seed (default: the first of the sampling seeds); refuses a fixture that
    cannot run on the host."""
    if fixture is not None:
        [chosen] = serve_fixtures(suite, host, (fixture,))
    else:
        mine = serve_fixtures(suite, host)
        chosen = sorted(mine, key=lambda f: (f.kind != "edit", f.reference_count))[0]
    return chosen, suite.sampling.seeds[0] if seed is None else seed


def _request(store: AttemptStore, flag_set: str, plan: Plan) -> RequestRecord | None:
    return next((r for r in store.requests if r.flag_set == flag_set
                 and r.fixture == plan.fixture.id and r.seed == plan.seed), None)


def _why_not(store: AttemptStore, flag_set: str, record: RequestRecord | None) -> str:
    if record is None:
        run = store.run(flag_set)
        init = f"init {run.init.outcome}" if run else "never started"
        return f"{flag_set}: no output ({init})"
    return f"{flag_set}: request {record.outcome}" + (f" ({record.error[:200]})"
                                                       if record.error else "")


def compare(store: AttemptStore, plan: Plan, deploy_path: str) -> PropagationCheck:
    """The check from the attempt's two requests; not measured unless both returned an image."""
    served = (f"served {plan.fixture.id} seed {plan.seed} with {deploy_path} "
              f"({plan.flag_set_with}) and without it ({plan.flag_set_without})")
    base = {"knob": plan.knob, "flag_set_with": plan.flag_set_with,
            "flag_set_without": plan.flag_set_without, "fixture": plan.fixture.id,
            "seed": plan.seed}
    records = {f: _request(store, f, plan) for f in (plan.flag_set_with, plan.flag_set_without)}
    missing = [f for f, r in records.items() if r is None or r.outcome != "ok" or not r.artifact]
    if missing:
        reasons = "; ".join(_why_not(store, f, records[f]) for f in missing)
        return PropagationCheck(**base, bytes_identical=None,
                                note=f"not measured: {served}, but {reasons}")
    a, b = records.values()
    artifacts = store.project.artifacts_dir
    pixels = [pixels_sha256(load_pixels(resolve_artifact(r.artifact, artifacts))) for r in (a, b)]
    run = store.run(plan.flag_set_with)
    ignored = run.lifetimes[-1].deploy_config_ignored if run and run.lifetimes else None
    return PropagationCheck(**base, bytes_identical=a.output_sha256 == b.output_sha256,
                            pixels_identical=pixels[0] == pixels[1], note=served,
                            deploy_config_ignored=ignored)


class PropagationSession(Session):
    """The propagation check: every invocation writes a new attempt (`-propagation`)."""

    def __init__(self, options: PropagationOptions, command: list[str], *,
                 readers: ReaderFactory | None = None, nvml=None):
        self.options, self.command, self.readers, self.nvml = options, command, readers, nvml
        self.probe: ServeProbe | None = None

    def prepare(self, ctx: Context) -> None:
        cfg, options = ctx.cfg, self.options
        with_, without = choose_flag_sets(cfg, ctx.host_name, ctx.host, options.flag_set_with,
                                          options.flag_set_without)
        settings = settings_of(ServeSettings, options, cfg, flag_sets=(with_, without))
        for flag_set in (with_, without):
            server_command(cfg, ctx.host_name, flag_set, port=settings.port,
                           model=settings.model, hosts_file=ctx.project.hosts_file)
        fixture, seed = choose_case(ctx.suite, ctx.host_name, ctx.host, options.fixture,
                                    options.seed)
        self.settings = replace(settings, fixtures=(fixture.id,))
        require_references([fixture], ctx.project.fixtures_file.parent,
                         max_pixels=cfg.probe.max_reference_pixels)
        self.plan = Plan(choose_knob(cfg, with_, options.knob), with_, without, fixture, seed)
        self.env = prepare_env(ctx.project, cfg, ctx.host_name, by_hand=options.model,
                               venv=options.venv, flag_sets=self.settings.flag_sets,
                               nvml=self.nvml, out=ctx.out)
        self.env_bin = self.env.bin_dir
        self.settings = replace(self.settings,
                                model=options.model or self.env.record.served.model)
        require_port_free(cfg.serve.bind_host, self.settings.port)

    def open_attempt(self, ctx: Context) -> AttemptStore:
        return new_attempt(ctx.project, ctx.host_name, ctx.host, self.command,
                           suffix=ATTEMPT_SUFFIX, what="propagation check",
                           environment=self.env.record)

    def run(self, ctx: Context, store: AttemptStore) -> int:
        cfg, plan = ctx.cfg, self.plan
        # The probe serves every sampling seed: give it a suite of the one seed compared.
        one_seed = ctx.suite.model_copy(update={"sampling": ctx.suite.sampling.model_copy(
            update={"seeds": [plan.seed]})})
        self.probe = probe = ServeProbe(
            cfg, one_seed, ctx.project.fixtures_file.parent, ctx.project.hosts_file,
            ctx.host_name, store, self.settings, env_bin=self.env_bin,
            alloc_var=self.env.alloc_var, out=ctx.out,
            readers=self.readers or default_readers(ctx.host, self.options.gpu_index))
        probe.probe_serve()
        probe.recorder.drain()
        deploy = cfg.deploy_configs[cfg.flag_sets[plan.flag_set_with].deploy_config]
        check = compare(store, plan, deploy.path)
        store.put_propagation([check])
        print(describe(check), file=ctx.out)
        print(f"attempt {store.meta.id}: evidence in {store.folder.relative_to(ctx.project.root)}",
              file=ctx.out)
        # Settled cells (an OOM, an init failure on record) answer the run even where the check
        # is not measured: only a lost or unmade one is exit 1.
        return settled_exit(unsettled(store, [plan.flag_set_with, plan.flag_set_without],
                                      [(plan.fixture.id, plan.seed)]), ctx.out)

    def close(self) -> None:
        if self.probe is not None:
            self.probe.recorder.close()

    def interrupted(self, store: AttemptStore) -> str:
        return f"the server was stopped; attempt {store.meta.id} holds no check"


def run_propagation(project: Project, options: PropagationOptions, *, command: list[str],
                    readers: ReaderFactory | None = None, nvml=None,
                    out: TextIO | None = None) -> int:
    """The propagation command: 0 when both cells are settled (plan.unsettled), whether or not
    the check could be measured from them.

    `command` is the command line recorded as the attempt's provenance; `nvml` stands in for
    pynvml in a real host's env checks, as for the probe."""
    return run_session(project, PropagationSession(options, command, readers=readers,
                                                   nvml=nvml), options.host, out)
