"""The capacity curve of an emulated host: for each flag set and reference count, the smallest
emulated capacity that served it (every request ok, sound output, no emulation breach).

The sweep (`probe-serve --caps ...`) writes one attempt series per cap; where a cap has several
attempts, the newest with a run of the flag set speaks for it, as a re-run supersedes.
"""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe.analysis.summaries import run_views
from omniprobe.analysis.verdicts import cells_by_refs, evaluate_run
from omniprobe.config.fixtures import FixtureSuite
from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.load import Evidence


@dataclass(frozen=True)
class CapRun:
    """One flag set at one cap, as its newest attempt recorded it."""

    cap_mib: int
    flag_set: str
    attempt: str
    initialised: bool
    asked_refs: tuple[int, ...]
    served_refs: tuple[int, ...]


@dataclass(frozen=True)
class CurveStep:
    flag_set: str
    reference_count: int
    min_cap_mib: int | None  # None: no cap tried served it
    largest_tried_mib: int


@dataclass(frozen=True)
class CapacityCurve:
    host: str
    caps_mib: tuple[int, ...]
    flag_sets: tuple[str, ...]
    reference_counts: tuple[int, ...]
    runs: tuple[CapRun, ...]
    steps: tuple[CurveStep, ...]

    def min_cap(self, flag_set: str, reference_count: int) -> int | None:
        return next((s.min_cap_mib for s in self.steps
                     if s.flag_set == flag_set and s.reference_count == reference_count), None)

    def max_served(self, flag_set: str, cap_mib: int) -> int | None:
        """The most references served at this cap; None when the flag set was not run there."""
        run = next((r for r in self.runs if r.flag_set == flag_set and r.cap_mib == cap_mib), None)
        return None if run is None else max(run.served_refs, default=0)


def capacity_curve(host_name: str, hosts: HostsConfig, fixtures: FixtureSuite,
                   evidence: Evidence) -> CapacityCurve | None:
    """The curve of an emulated host's attempts; None for a host that is not emulated or has no
    emulated attempt."""
    host = hosts.host(host_name)
    if host.emulation is None:
        return None
    attempts = [a for a in evidence.for_host(host_name, include_simulated=host.simulated,
                                              include_emulated=True) if a.emulated]
    newest: dict[tuple[int, str], CapRun] = {}
    for attempt in sorted(attempts, key=lambda a: a.id):
        cap = attempt.meta.provenance.cap_mib
        for view in run_views(attempt):
            result = evaluate_run(view, fixtures)
            asked = tuple(sorted(r for r in cells_by_refs(view.cells, fixtures) if r > 0))
            newest[cap, view.flag_set] = CapRun(cap, view.flag_set, attempt.id,
                                                result.initialised, asked, result.served_refs)
    if not newest:
        return None
    runs = tuple(sorted(newest.values(), key=lambda r: (r.cap_mib, r.flag_set)))
    order = {name: i for i, name in enumerate(host.serve_flag_sets)}
    flag_sets = tuple(sorted({r.flag_set for r in runs}, key=lambda n: (order.get(n, len(order)), n)))
    counts = tuple(sorted({count for run in runs for count in run.asked_refs}))
    steps = []
    for flag_set in flag_sets:
        mine = [r for r in runs if r.flag_set == flag_set]
        for count in counts:
            served = [r.cap_mib for r in mine if count in r.served_refs]
            steps.append(CurveStep(flag_set, count, min(served, default=None),
                                   max(r.cap_mib for r in mine)))
    return CapacityCurve(host_name, tuple(sorted({r.cap_mib for r in runs})), flag_sets, counts,
                         runs, tuple(steps))


def served_at(curve: CapacityCurve, flag_set: str, reference_count: int) -> dict[int, bool]:
    """{cap MiB: served} of one flag set and reference count, over the caps that say something of
    it: those whose server was asked for the count, and those whose server did not start (nothing
    was served there). A cap whose server started but was never asked for the count is left out:
    the count was not run there, which is no failure."""
    return {r.cap_mib: reference_count in r.served_refs for r in curve.runs
            if r.flag_set == flag_set and (not r.initialised or reference_count in r.asked_refs)}
