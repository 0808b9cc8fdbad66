"""The probe-capacity session: on a Diffusers host without an emulation cap (the search sets its
own pool limit per trial), which attempt it writes and the search it runs."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import TextIO

from omniprobe.config.diffusers import profile_differences
from omniprobe.config.hosts import load_hosts
from omniprobe.config.project import Project
from omniprobe.config.selection import resolve_host
from omniprobe.errors import InputError, Problem
from omniprobe.evidence.attempts import AttemptStore, SettingsChanged, open_probe_attempt
from omniprobe.evidence.models.capacity import SearchSettings, grid_chooser
from omniprobe.harness.common.lifetime import ReaderFactory
from omniprobe.harness.common.options import (
    CEILING,
    FLOOR,
    REPEATS,
    RESOLUTION,
    CapacityOptions,
    settings_of,
)
from omniprobe.harness.common.plan import settled_line
from omniprobe.harness.common.selection import PlanError
from omniprobe.harness.common.session import Context, close_attempt, run_session
from omniprobe.harness.offline.capacity import ATTEMPT_SUFFIX, CapacityProbe, SearchPlan
from omniprobe.harness.offline.env import build_diffusers_env
from omniprobe.harness.offline.matrix import OfflineEntry
from omniprobe.harness.offline.plan import OfflineSettings
from omniprobe.harness.offline.session import OfflineSession
from omniprobe_engine.search import RULE_VERSION, Grid, SearchError


class NotASearchHost(PlanError):
    """A host the capacity search cannot run on."""


@dataclass(frozen=True)
class CapacitySettings(OfflineSettings):
    # The flags' own defaults (settings_of fills these from the options).
    floor_mib: int = FLOOR.default
    ceiling_mib: int = CEILING.default
    resolution_mib: int = RESOLUTION.default
    repeats: int = REPEATS.default


def search_settings(options: CapacityOptions) -> SearchSettings:
    """The grid, refused before any work where it cannot be one (exit 2, naming the flag); who
    chose it is the attempt's to say (attempt_grid)."""
    try:
        Grid(options.floor_mib, options.ceiling_mib, options.resolution_mib)
    except SearchError as exc:
        flag = ("--resolution-mib" if "resolution" in str(exc) else "--floor-mib")
        raise InputError([Problem("the command line", flag, f"{exc}")]) from None
    return SearchSettings(floor_mib=options.floor_mib, ceiling_mib=options.ceiling_mib,
                          resolution_mib=options.resolution_mib, repeats=options.repeats,
                          rule=RULE_VERSION)


class CapacitySession(OfflineSession):
    """probe-capacity: resumes the host's newest capacity attempt made in this environment, or
    with --fresh starts one."""

    def __init__(self, options: CapacityOptions, command: list[str], *,
                 readers: ReaderFactory | None = None, nvml=None):
        super().__init__(options, command, readers=readers, nvml=nvml)

    def prepare(self, ctx: Context) -> None:
        if ctx.host.diffusers is None:
            raise NotASearchHost(f"host {ctx.host_name!r} has no [hosts.{ctx.host_name}.diffusers]"
                                 ": the capacity search runs the Diffusers engine, whose pipeline "
                                 "survives an OOM")
        if ctx.host.emulation is not None:
            raise NotASearchHost(f"host {ctx.host_name!r} is emulated: the search sets torch's "
                                 "pool limit itself, trial by trial, so it runs on a host "
                                 "without [emulation] (the band holds for any card)")
        self.search_plan_settings = search_settings(self.options)
        super().prepare(ctx)
        self.settings = settings_of(CapacitySettings, self.options, ctx.cfg,
                                    model=self.settings.model)
        by_count = {}
        for plans in self.plans.values():
            for planned in plans:
                by_count.setdefault(planned.fixture.reference_count, planned.fixture)
        self.search_plan = SearchPlan(self.search_plan_settings, dict(sorted(by_count.items())),
                                      self.options.speed_steps)

    def open_attempt(self, ctx: Context) -> AttemptStore:
        counts = set(self.search_plan.fixtures)

        def complete(found: AttemptStore) -> bool:
            searched = {s.profile: s for s in found.capacity}
            return all(e.name in searched
                       and searched[e.name].done(counts, self.search_plan.speed_steps)
                       for e in self.entries)

        store, self.attempt_reason = open_probe_attempt(
            ctx.project, ctx.host_name, ctx.host, self.command, environment=self.environment,
            fresh=self.options.fresh, fresh_id=None, complete=complete, kind=ATTEMPT_SUFFIX,
            what="probe-capacity", weights=ctx.host.diffusers.weights)
        return store

    def run(self, ctx: Context, store: AttemptStore) -> int:
        out = ctx.out
        self.search_plan = replace(self.search_plan,
                                   settings=attempt_grid(store, self.search_plan.settings))
        refuse_changed_settings(store, self.entries, self.search_plan.settings)
        print(f"attempt {store.meta.id} ({self.attempt_reason})", file=out)
        probe = CapacityProbe(self.supervisor(ctx, store))
        probe.search(self.entries, self.search_plan)
        close_attempt(ctx, store, probe.unfinished, probe.environment_failures, "profiles", out)
        print(settled_line(probe.unfinished), file=out)
        return 1 if probe.unfinished else 0


def attempt_grid(store: AttemptStore, search: SearchSettings) -> SearchSettings:
    """The grid as the attempt records it: who chose it is said by the command that made the
    attempt (its provenance), which a resume, held to the same grid, does not change."""
    return search.model_copy(update={"chosen_by": grid_chooser(store.meta.provenance.command)})


def refuse_changed_settings(store: AttemptStore, entries: list[OfflineEntry],
                            search: SearchSettings) -> None:
    """The resume rule, before any runner starts: a profile searched under other profile or
    search settings than it would run with now is refused, naming each difference; one not
    searched yet runs under the attempt's grid (its searches' one), or the attempt would hold
    two."""
    changes = {}
    grid = store.capacity[0].search if store.capacity else None
    for entry in entries:
        done = next((s for s in store.capacity if s.profile == entry.name), None)
        if done is not None:
            found = (profile_differences(done.settings, entry.kwargs["profile"])
                     + done.search.differences(search))
        elif any(t.profile == entry.name for t in store.capacity_trials):
            found = ["trials recorded with no search on record (a run killed before it "
                     "recorded one): what they ran under is unknown"]
        else:  # not searched yet: the attempt's grid holds it
            found = [f"{d} (the attempt's grid)" for d in grid.differences(search)] if grid else []
        if found:
            changes[entry.name] = found
    if changes:
        raise SettingsChanged.of(store.meta.id, changes)


def run_capacity(project: Project, options: CapacityOptions, *, command: list[str],
                 readers: ReaderFactory | None = None, nvml=None,
                 out: TextIO | None = None) -> int:
    """The probe-capacity command: 0 when every profile's search ended with its bands."""
    cfg = load_hosts(project.hosts_file)
    host_name, _ = resolve_host(project, cfg, options.host)
    if options.build_env:
        build_diffusers_env(project, host_name, cfg.host(host_name), out or sys.stderr)
    return run_session(project, CapacitySession(options, command, readers=readers, nvml=nvml),
                       options.host, out)

