"""Per-host verdicts, computed from evidence alone by the rules below.

- A reference count is served by a run when every cell at that count is ok with sound output.
- A host is built when some run serves the target reference count.
- Otherwise the blocker is `init` when no run got past server start; `quality` when some run
  fits the target count (every request ok) but its output is not sound; `capacity` when a run
  asked for the target count and did not fit; else `untested`: no run asked for it at all.
- Simulated evidence counts only for a simulated host; emulated evidence only for the emulated
  host it was filed under, never for the host it emulates.
- An emulated host's verdict reads its attempts at the emulated card's capacity only.
- On an emulated host, a cell whose server's process tree exceeded the cap (emulation breached)
  does not fit, whatever its outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from omniprobe.analysis.summaries import RunView, run_views
from omniprobe.config.fixtures import FixtureSuite
from omniprobe.config.hosts import Host, HostsConfig
from omniprobe.evidence.models import Baseline, Cell, Evidence
from omniprobe.evidence.quantities import Range

Verdict = Literal["built", "not-built", "no-evidence"]
Blocker = Literal["init", "capacity", "quality", "untested"]


@dataclass(frozen=True)
class RunResult:
    view: RunView
    initialised: bool
    served_refs: tuple[int, ...]
    fitting_refs: tuple[int, ...]

    @property
    def flag_set(self) -> str:
        return self.view.flag_set

    @property
    def highest_served(self) -> int:
        return max(self.served_refs, default=0)


@dataclass(frozen=True)
class Speedup:
    attempt: str
    flag_set: str
    fixture: str
    reference_count: int
    quality: str
    baseline_wall_s: float
    wall_s: Range
    speedup: Range


@dataclass(frozen=True)
class CapacityUnlock:
    flag_set: str
    attempt: str
    quality: str


@dataclass(frozen=True)
class HostVerdict:
    host: str
    verdict: Verdict
    blocker: Blocker | None
    target_refs: int
    highest_served_refs: int
    served_by: tuple[str, ...]
    capacity_unlocks: tuple[CapacityUnlock, ...]
    initialised: tuple[str, ...]
    failed_init: tuple[str, ...]
    speedups: tuple[Speedup, ...]
    attempts: tuple[str, ...]


def cells_by_refs(cells, fixtures: FixtureSuite) -> dict[int, list[Cell]]:
    grouped: dict[int, list[Cell]] = {}
    for cell in cells:
        grouped.setdefault(fixtures.get(cell.fixture).reference_count, []).append(cell)
    return grouped


def evaluate_run(view: RunView, fixtures: FixtureSuite) -> RunResult:
    by_refs = cells_by_refs(view.cells, fixtures)
    fitting = sorted(r for r, cells in by_refs.items() if r > 0
                     and all(c.outcome == "ok" and c.emulation_breach is None for c in cells))
    served = [r for r in fitting if all(c.quality == "sound" for c in by_refs[r])]
    return RunResult(view, view.run.init.outcome == "ready", tuple(served), tuple(fitting))


def speedups(view: RunView, baseline: Baseline, fixtures: FixtureSuite) -> list[Speedup]:
    walls = {w.fixture: w.wall_s for w in baseline.walls}
    out = []
    for cell in view.cells:
        if cell.outcome != "ok" or cell.wall_s is None or cell.fixture not in walls:
            continue
        base = walls[cell.fixture]
        out.append(Speedup(
            attempt=view.attempt.id, flag_set=view.flag_set, fixture=cell.fixture,
            reference_count=fixtures.get(cell.fixture).reference_count, quality=cell.quality,
            baseline_wall_s=base, wall_s=cell.wall_s,
            speedup=Range(min=base / cell.wall_s.max, max=base / cell.wall_s.min),
        ))
    return out


def _ordered(names, host: Host) -> tuple[str, ...]:
    order = {name: i for i, name in enumerate(host.serve_flag_sets)}
    return tuple(sorted(set(names), key=lambda n: (order.get(n, len(order)), n)))


def host_verdict(name: str, hosts: HostsConfig, fixtures: FixtureSuite,
                 evidence: Evidence) -> HostVerdict:
    host = hosts.host(name)
    target = hosts.probe.target_reference_count
    attempts = evidence.for_host(name, include_simulated=host.simulated,
                                 include_emulated=host.emulation is not None)
    cap = hosts.emulated_cap_mib(name)
    if cap is not None:  # the emulated card's own capacity; a sweep's other caps are the curve's
        attempts = [a for a in attempts if a.meta.provenance.cap_mib == cap]
    results = [evaluate_run(v, fixtures) for a in attempts for v in run_views(a)]
    initialised = _ordered((r.flag_set for r in results if r.initialised), host)
    failed = _ordered((r.flag_set for r in results if not r.initialised), host)
    highest = max((r.highest_served for r in results), default=0)
    served_by = _ordered((r.flag_set for r in results if highest and r.highest_served == highest), host)
    unlocks = []
    for r in results:
        if target in r.fitting_refs:
            at_target = cells_by_refs(r.view.cells, fixtures)[target]
            quality = "sound" if target in r.served_refs else (
                "broken" if any(c.quality == "broken" for c in at_target) else "unchecked")
            unlocks.append(CapacityUnlock(r.flag_set, r.view.attempt.id, quality))

    baselines = {a.id: a.baseline for a in evidence.attempts if a.baseline is not None}
    found = []
    for r in results:
        base = baselines.get(r.view.attempt.meta.baseline or "")
        if base is not None:
            found.extend(speedups(r.view, base, fixtures))

    if not results:
        verdict, blocker = "no-evidence", None
    elif any(target in r.served_refs for r in results):
        verdict, blocker = "built", None
    elif not initialised:
        verdict, blocker = "not-built", "init"
    elif unlocks:
        verdict, blocker = "not-built", "quality"
    elif any(target in cells_by_refs(r.view.cells, fixtures) for r in results):
        verdict, blocker = "not-built", "capacity"
    else:
        verdict, blocker = "not-built", "untested"
    return HostVerdict(
        host=name, verdict=verdict, blocker=blocker, target_refs=target,
        highest_served_refs=highest, served_by=served_by, capacity_unlocks=tuple(unlocks),
        initialised=initialised, failed_init=failed, speedups=tuple(found),
        attempts=tuple(a.id for a in attempts),
    )


def all_verdicts(hosts: HostsConfig, fixtures: FixtureSuite,
                 evidence: Evidence) -> dict[str, HostVerdict]:
    return {name: host_verdict(name, hosts, fixtures, evidence) for name in hosts.hosts}
