"""Per-host verdicts, computed from evidence alone by the rules below.

- A reference count is served by a run when every cell at that count is ok with sound output.
- A host is built when some run serves the target reference count.
- Otherwise the blocker is `init` when no run got past server start; `structure` when some run
  fits the target count (every request ok) but its output is not sound; `capacity` when a run
  asked for the target count and did not fit; else `untested`: no run asked for it at all.
- Simulated evidence counts only for a simulated host; emulated evidence only for the emulated
  host it was filed under, never for the host it emulates.
- An emulated host's verdict reads its attempts at the emulated card's capacity only.
- On an emulated host, a cell whose server's process tree exceeded the cap (emulation breached)
  does not fit, whatever its outcome.
- Stand-in inputs (omniprobe's, in place of inputs the source does not state) count for capacity
  (fits, OOM, peaks, OOM signatures) and for output structure, which do not depend on what the
  pictures show; never for speed-ups against the baseline, which ran the original inputs. The
  verdict says which half rests on stand-ins.
- Only the card's failures are evidence about the card (`failure_cause`): a run whose init failed
  for the server software, the environment or an unclassified cause, and a request that failed
  so, are left out of the rules above and listed as not measured. A host with runs but none
  measured is `not-measured`, never blocked at init.

Every blocker, not only the headline one: each flag set that does not serve the target count is
blocked by the first of init, capacity, structure, untested that holds for it, and the verdict lists
each blocker with its flag sets in that order. A capacity blocker names the OOM signatures its flag
sets' evidence records, each with only the flag sets that record it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from omniprobe.analysis.summaries import ServeRunView, run_views
from omniprobe.classify.failure_cause import cause_text, is_card_evidence
from omniprobe.config.fixtures import FixtureSuite
from omniprobe.config.host_entry import Host
from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.load import Evidence, LoadedAttempt
from omniprobe.evidence.models.outputs import Baseline
from omniprobe.evidence.models.runs import Cell
from omniprobe.evidence.quantities import Range

Verdict = Literal["built", "not-built", "not-measured", "no-evidence"]
Blocker = Literal["init", "capacity", "structure", "untested"]


@dataclass(frozen=True)
class ServeRunResult:
    view: ServeRunView
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
    structure: str
    baseline_wall_s: float
    wall_s: Range
    speedup: Range


@dataclass(frozen=True)
class CapacityUnlock:
    """A run that fits the target reference count, with the figures of that very cell."""

    flag_set: str
    attempt: str
    structure: str
    fixture: str | None = None
    wall_s: Range | None = None
    server_peak_mb: Range | None = None
    run_gpu_peak_mib: int | None = None


@dataclass(frozen=True)
class OomGroup:
    """Flag sets whose evidence records one OOM signature at the target count; an empty
    signature (requested and location None) groups the flag sets that record none."""

    requested: str | None
    location: str | None
    flag_sets: tuple[str, ...]


@dataclass(frozen=True)
class BlockerEntry:
    kind: Blocker
    flag_sets: tuple[str, ...]
    oom_signatures: tuple[OomGroup, ...] = ()


@dataclass(frozen=True)
class UnreachedKnob:
    """A flag set whose knob the propagation evidence shows never reached the model: it ran as
    its base flag set."""

    flag_set: str
    base: str
    knob: str
    attempt: str


@dataclass(frozen=True)
class NotMeasured:
    """Failures that say nothing about the card, grouped by attempt, flag set, phase and cause."""

    attempt: str
    flag_set: str
    phase: Literal["init", "request"]
    cause: str
    count: int


def not_measured(attempts) -> tuple[NotMeasured, ...]:
    """Every init and request failure of the attempts whose cause is not the card's."""
    counts: dict[tuple[str, str, str, str], int] = {}
    for attempt in attempts:
        for run in attempt.runs:
            inits = [lt.init for lt in run.lifetimes] or [run.init]
            for init in inits:
                if not is_card_evidence(init.outcome, init.cause):
                    key = (attempt.id, run.flag_set, "init", cause_text(init.outcome, init.cause))
                    counts[key] = counts.get(key, 0) + 1
        for record in attempt.requests:
            if not is_card_evidence(record.outcome, record.cause):
                key = (attempt.id, record.flag_set, "request",
                       cause_text(record.outcome, record.cause))
                counts[key] = counts.get(key, 0) + 1
    return tuple(NotMeasured(*key, count) for key, count in counts.items())


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
    blockers: tuple[BlockerEntry, ...] = ()
    unreached: tuple[UnreachedKnob, ...] = ()
    not_measured: tuple[NotMeasured, ...] = ()
    unreached_offline: tuple[UnreachedKnob, ...] = ()  # offline kwarg sets, as `unreached`
    capacity_inputs: tuple[str, ...] = ()
    structure_inputs: tuple[str, ...] = ()
    unpinned: tuple[UnpinnedModel, ...] = ()

    @property
    def standin_halves(self) -> tuple[str, ...]:
        """The halves of the verdict that rest, at least in part, on stand-in inputs."""
        return tuple(half for half, inputs in (("capacity", self.capacity_inputs),
                                               ("output structure", self.structure_inputs))
                     if "stand-in" in inputs)


@dataclass(frozen=True)
class UnpinnedModel:
    """An attempt whose server was given a model by hand (--model), not the pinned snapshot."""

    attempt: str
    model: str


def unpinned_models(attempts) -> tuple[UnpinnedModel, ...]:
    return tuple(UnpinnedModel(a.id, a.meta.environment.served.model) for a in attempts
                 if a.meta.environment is not None
                 and a.meta.environment.served.source == "by_hand")


def cells_by_refs(cells, fixtures: FixtureSuite) -> dict[int, list[Cell]]:
    grouped: dict[int, list[Cell]] = {}
    for cell in cells:
        grouped.setdefault(fixtures.get(cell.fixture).reference_count, []).append(cell)
    return grouped


def evaluate_run(view: ServeRunView, fixtures: FixtureSuite) -> ServeRunResult:
    by_refs = cells_by_refs(view.cells, fixtures)
    fitting = sorted(r for r, cells in by_refs.items() if r > 0
                     and all(c.outcome == "ok" and c.emulation_breach is None for c in cells))
    served = [r for r in fitting if all(c.structure == "sound" for c in by_refs[r])]
    return ServeRunResult(view, view.run.init.outcome == "ready", tuple(served), tuple(fitting))


def capacity_inputs(results: list[ServeRunResult]) -> tuple[str, ...]:
    """Whose inputs the capacity half read: every cell of every run, whatever its outcome."""
    return tuple(sorted({c.inputs for r in results for c in r.view.cells}))


def structure_inputs(results: list[ServeRunResult]) -> tuple[str, ...]:
    """Whose inputs the output-structure half read: the cells whose output was checked."""
    return tuple(sorted({c.inputs for r in results for c in r.view.cells
                         if c.structure != "unchecked"}))


def compares_to_baseline(cell: Cell) -> bool:
    """Speed against the baseline means something only on the baseline's own inputs."""
    return cell.inputs == "original"


def speedups(view: ServeRunView, baseline: Baseline, fixtures: FixtureSuite) -> list[Speedup]:
    walls = {w.fixture: w.wall_s for w in baseline.walls}
    out = []
    for cell in view.cells:
        if (cell.outcome != "ok" or cell.wall_s is None or cell.fixture not in walls
                or not compares_to_baseline(cell)):
            continue
        base = walls[cell.fixture]
        out.append(Speedup(
            attempt=view.attempt.id, flag_set=view.flag_set, fixture=cell.fixture,
            reference_count=fixtures.get(cell.fixture).reference_count, structure=cell.structure,
            baseline_wall_s=base, wall_s=cell.wall_s,
            speedup=Range(min=base / cell.wall_s.max, max=base / cell.wall_s.min),
        ))
    return out


def _ordered(names, host: Host) -> tuple[str, ...]:
    order = {name: i for i, name in enumerate(host.serve_flag_sets)}
    return tuple(sorted(set(names), key=lambda n: (order.get(n, len(order)), n)))


def verdict_attempts(name: str, hosts: HostsConfig, evidence: Evidence) -> list[LoadedAttempt]:
    """The attempts a host's verdict reads: its own, simulated ones only for a simulated host;
    an emulated host's at the emulated card's capacity (a sweep's other caps are the curve's)."""
    host = hosts.host(name)
    attempts = evidence.for_host(name, include_simulated=host.simulated,
                                 include_emulated=host.emulation is not None)
    cap = hosts.emulated_cap_mib(name)
    return attempts if cap is None else [a for a in attempts if a.meta.provenance.cap_mib == cap]


def host_verdict(name: str, hosts: HostsConfig, fixtures: FixtureSuite,
                 evidence: Evidence) -> HostVerdict:
    host = hosts.host(name)
    target = hosts.probe.target_reference_count
    attempts = verdict_attempts(name, hosts, evidence)
    # A run whose init failed for a cause other than the card measured nothing about it.
    results = [evaluate_run(v, fixtures) for a in attempts for v in run_views(a)
               if is_card_evidence(v.run.init.outcome, v.run.init.cause)]
    unmeasured = not_measured(attempts)
    initialised = _ordered((r.flag_set for r in results if r.initialised), host)
    failed = _ordered((r.flag_set for r in results if not r.initialised), host)
    highest = max((r.highest_served for r in results), default=0)
    served_by = _ordered((r.flag_set for r in results if highest and r.highest_served == highest), host)
    unlocks = [u for r in results for u in capacity_unlocks(r, fixtures, target)]

    baselines = {a.id: a.baseline for a in evidence.attempts if a.baseline is not None}
    found = []
    for r in results:
        base = baselines.get(r.view.attempt.meta.baseline or "")
        if base is not None:
            found.extend(speedups(r.view, base, fixtures))

    if not results:
        verdict, blocker = ("not-measured" if unmeasured else "no-evidence"), None
    elif any(target in r.served_refs for r in results):
        verdict, blocker = "built", None
    elif not initialised:
        verdict, blocker = "not-built", "init"
    elif unlocks:
        verdict, blocker = "not-built", "structure"
    elif any(target in cells_by_refs(r.view.cells, fixtures) for r in results):
        verdict, blocker = "not-built", "capacity"
    else:
        verdict, blocker = "not-built", "untested"
    return HostVerdict(
        host=name, verdict=verdict, blocker=blocker, target_refs=target,
        highest_served_refs=highest, served_by=served_by, capacity_unlocks=tuple(unlocks),
        initialised=initialised, failed_init=failed, speedups=tuple(found),
        attempts=tuple(a.id for a in attempts),
        blockers=blockers(results, fixtures, target, host),
        unreached=unreached_knobs(attempts),
        unpinned=unpinned_models(attempts), not_measured=unmeasured,
        unreached_offline=unreached_knobs(attempts, via="offline"),
        capacity_inputs=capacity_inputs(results), structure_inputs=structure_inputs(results),
    )


def capacity_unlocks(result: ServeRunResult, fixtures: FixtureSuite, target: int) -> list[CapacityUnlock]:
    """One unlock per target-count cell of a run that fits the target count, carrying that cell's
    own figures (never another cell's)."""
    if target not in result.fitting_refs:
        return []
    at_target = cells_by_refs(result.view.cells, fixtures)[target]
    structure = "sound" if target in result.served_refs else (
        "broken" if any(c.structure == "broken" for c in at_target) else "unchecked")
    return [CapacityUnlock(result.flag_set, result.view.attempt.id, structure, cell.fixture,
                           cell.wall_s, cell.server_peak_mb, result.view.run.gpu_peak_mib)
            for cell in at_target]


BLOCKER_ORDER: tuple[Blocker, ...] = ("init", "capacity", "structure", "untested")


def flag_set_blocker(results: list[ServeRunResult], fixtures: FixtureSuite, target: int) -> Blocker | None:
    """What keeps one flag set (all its runs) from serving the target count; None if it serves."""
    if any(target in r.served_refs for r in results):
        return None
    if not any(r.initialised for r in results):
        return "init"
    if any(target in r.fitting_refs for r in results):
        return "structure"
    if any(target in cells_by_refs(r.view.cells, fixtures) for r in results):
        return "capacity"
    return "untested"


def oom_groups(results: list[ServeRunResult], fixtures: FixtureSuite, target: int,
               host: Host) -> tuple[OomGroup, ...]:
    """The OOM signatures recorded at the target count, each with the flag sets that record it."""
    groups: dict[tuple[str | None, str | None], list[str]] = {}
    for r in results:
        for cell in cells_by_refs(r.view.cells, fixtures).get(target, []):
            if cell.outcome != "oom":
                continue
            oom = cell.oom
            key = ((oom.requested, str(oom.location) if oom.location else None)
                   if oom is not None and (oom.requested or oom.location) else (None, None))
            groups.setdefault(key, []).append(r.flag_set)
    ordered = [OomGroup(req, loc, _ordered(names, host)) for (req, loc), names in groups.items()]
    order = {name: i for i, name in enumerate(host.serve_flag_sets)}
    # Recorded signatures first, in the order of their first flag set; then those with none.
    return tuple(sorted(ordered, key=lambda g: (g.requested is None and g.location is None,
                                                order.get(g.flag_sets[0], len(order)),
                                                g.flag_sets[0])))


def blockers(results: list[ServeRunResult], fixtures: FixtureSuite, target: int,
             host: Host) -> tuple[BlockerEntry, ...]:
    """Every blocker of the host, in BLOCKER_ORDER, each with the flag sets it applies to."""
    by_flag_set: dict[str, list[ServeRunResult]] = {}
    for r in results:
        by_flag_set.setdefault(r.flag_set, []).append(r)
    kinds: dict[Blocker, list[str]] = {}
    for flag_set, runs in by_flag_set.items():
        kind = flag_set_blocker(runs, fixtures, target)
        if kind is not None:
            kinds.setdefault(kind, []).append(flag_set)
    entries = []
    for kind in BLOCKER_ORDER:
        if kind not in kinds:
            continue
        names = _ordered(kinds[kind], host)
        signatures = ()
        if kind == "capacity":
            signatures = oom_groups([r for r in results if r.flag_set in names], fixtures, target, host)
        entries.append(BlockerEntry(kind, names, signatures))
    return tuple(entries)


def unreached_knobs(attempts, via: str = "serve") -> tuple[UnreachedKnob, ...]:
    """Flag sets (via "offline": offline kwarg sets) whose latest propagation check shows their
    knob never reached the model: each ran as the one it was compared with."""
    latest: dict[str, UnreachedKnob | None] = {}
    for attempt in sorted(attempts, key=lambda a: (a.meta.date, a.id)):
        for check in attempt.propagation:
            reached = check.reached_model
            if reached is None or check.via != via:
                continue
            latest[check.flag_set_with] = None if reached else UnreachedKnob(
                check.flag_set_with, check.flag_set_without, check.knob, attempt.id)
    return tuple(u for u in latest.values() if u is not None)


def all_verdicts(hosts: HostsConfig, fixtures: FixtureSuite,
                 evidence: Evidence) -> dict[str, HostVerdict]:
    return {name: host_verdict(name, hosts, fixtures, evidence) for name in hosts.hosts}


@dataclass(frozen=True)
class HistoryEntry:
    """The host's verdict as of one attempt: computed from that attempt and every earlier one."""

    attempt: str
    date: str
    provenance: str
    upstream_commit: str | None
    torch: str | None
    model_snapshot: str | None
    verdict: HostVerdict
    pins_from: str | None = None


def _attempt_order(a: LoadedAttempt) -> tuple[str, str]:
    return (a.meta.date, a.id)


def attempt_pins(a: LoadedAttempt, earlier: list[LoadedAttempt] = ()
                 ) -> tuple[str | None, str | None, str | None, str | None]:
    """(upstream commit, torch, model snapshot, the attempt they come from): as the attempt states
    them; else as the environment manifest it carries, or else the host's newest one filed before
    it (the probe runs only in a checked environment), resolved them; else unknown."""
    if a.meta.pins is not None:
        return a.meta.pins.upstream_commit, a.meta.pins.torch, a.meta.pins.model_snapshot, a.id
    filed = [e for e in (a, *reversed(earlier)) if e.environment is not None]
    if filed:
        env = filed[0].environment
        resolved = {p.name: p.resolved for p in env.pins}
        return resolved.get("vllm-omni"), resolved.get("torch"), env.model_snapshot, filed[0].id
    return None, None, None, None


def verdict_history(name: str, hosts: HostsConfig, fixtures: FixtureSuite,
                    evidence: Evidence) -> list[HistoryEntry]:
    """Oldest first, one entry per attempt of the host that ran the server."""
    host = hosts.host(name)
    every = sorted(evidence.for_host(name, include_simulated=host.simulated), key=_attempt_order)
    history = []
    for i, attempt in enumerate(every):
        if not (attempt.runs or attempt.requests):
            continue
        cut = _attempt_order(attempt)
        upto = Evidence([a for a in evidence.attempts if a.host != name or _attempt_order(a) <= cut])
        *pins, pins_from = attempt_pins(attempt, every[:i])
        history.append(HistoryEntry(attempt.id, attempt.meta.date, attempt.meta.provenance.kind,
                                    *pins, host_verdict(name, hosts, fixtures, upto), pins_from))
    return history
