"""What the capacity search's bands say: the smallest pool per profile and reference count, each
card's verdict from its own usable pool, and the sweep's cells held against the bands.

A band (evidence/models/capacity.py) fits at every trial at or above A and failed at every trial
at or below B. A card whose usable pool is at or above A fits, with its margin; at or below B it
does not, with its shortfall; in between it is at the margin. A fit is judged on torch's pool
against the card's usable pool (memory.total less its own overhead and its host's other
processes), never on the measuring machine's process tree. Random weights: capacity only.

Bands set torch's own pool limit, so a profile searched on two machines should band alike; where
it was, `machine_agreement` says how far apart they came. Walls are the measuring machine's:
each timed request keeps its host, and walls compare only on one host.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from omniprobe.analysis.diffusers_capacity import ProfileRun
from omniprobe.config.cards import Card
from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.load import Evidence
from omniprobe.evidence.models.capacity import (
    CapacityBand,
    CapacityTrial,
    ProfileSearch,
    TimedRequest,
)

TimedKey = tuple[str, int, int]  # (host, steps, reference count)


@dataclass(frozen=True)
class Searched:
    """A profile's newest search, with the attempt that holds it, its counted trials and those
    set aside (recorded, never counted toward a band), the timed requests of every search of the
    profile, each with its host, oldest first (None: the newest search's own), and the newest
    search on each other host."""

    attempt: str
    host: str
    search: ProfileSearch
    trials: tuple[CapacityTrial, ...] = ()
    set_aside: tuple[CapacityTrial, ...] = ()
    timed: tuple[tuple[str, TimedRequest], ...] | None = None
    elsewhere: tuple[Searched, ...] = ()  # the newest search on each other host

    def __post_init__(self):
        if self.timed is None:
            object.__setattr__(self, "timed", tuple((self.host, t) for t in self.search.timed))

    @property
    def runners(self) -> int:
        """How many runner processes the curve took (a resume or a restart adds one)."""
        return max(len(self.search.logs), 1 + len(self.search.restarts),
                   len({t.lifetime for t in (*self.trials, *self.set_aside)}))

    def start_figures(self) -> str:
        """Whether its trials recorded what they started with: trials before the figures were
        carried are read as before, and said so."""
        every = (*self.trials, *self.set_aside)
        recorded = sum(t.start_recorded for t in every)
        if recorded == len(every):
            return "recorded"
        return "not recorded" if not recorded else f"{recorded} of {len(every)} recorded"

    def on(self, host: str) -> Searched | None:
        """This profile's newest search on `host`, if any."""
        return next((s for s in (self, *self.elsewhere) if s.host == host), None)

    def band(self, refs: int) -> CapacityBand | None:
        return next((b for b in self.search.bands if b.reference_count == refs), None)

    def timed_fits(self) -> dict[TimedKey, TimedRequest]:
        """Its timed requests that fit, by (host, steps, reference count); the newest where
        repeated."""
        return {(host, t.num_inference_steps, t.reference_count): t for host, t in self.timed
                if t.outcome == "fit"}


def _measured_attempts(evidence: Evidence):
    """The measured attempts, oldest first, each with the model folder it records (None where it
    records none)."""
    for attempt in sorted(evidence.attempts, key=lambda a: a.id):
        served = attempt.meta.environment.served if attempt.meta.environment else None
        if not attempt.simulated:
            yield attempt, served.configs if served is not None else None


def searched_configs(evidence: Evidence) -> list[str]:
    """The model folders the measured capacity searches were built from, in the order first
    searched."""
    return list(dict.fromkeys(configs for attempt, configs in _measured_attempts(evidence)
                              if attempt.capacity and configs is not None))


def unsearched_models(evidence: Evidence, hosts: HostsConfig) -> dict[str, list[str]]:
    """Each model folder a GPU host is built from that no measured capacity search is of, with
    the hosts that would search it (not capped like a card): a model set up, not measured yet."""
    searched = set(searched_configs(evidence))
    out: dict[str, list[str]] = {}
    for name, host in hosts.hosts.items():
        folder = host.diffusers.configs if host.diffusers else None
        if (folder is not None and folder not in searched and host.has_gpu
                and host.emulation is None):
            out.setdefault(folder, []).append(name)
    return out


def _searches_of(evidence: Evidence, configs: str):
    """Each search of the model built from `configs`, oldest first, with its attempt and
    trials."""
    for attempt, built_from in _measured_attempts(evidence):
        if built_from != configs:
            continue
        for search in attempt.capacity:
            yield attempt, search, [t for t in attempt.capacity_trials
                                    if t.profile == search.profile]


def newest_searches(evidence: Evidence, configs: str) -> dict[str, Searched]:
    """Profile -> its newest search of the model built from `configs` (the committed folder its
    attempt records), over every measured attempt, with the newest on each other host beside it
    (`elsewhere`). A search whose trials set no pool limit (on the CPU there is none) answers
    for no card and is left out; a newer search supersedes an older one only where it banded
    every count the older one did, so a partial re-run never hides a complete search."""
    found: dict[str, Searched] = {}
    on_host: dict[tuple[str, str], Searched] = {}
    timed: dict[str, list[tuple[str, TimedRequest]]] = {}
    for attempt, search, mine in _searches_of(evidence, configs):
        timed.setdefault(search.profile, []).extend((attempt.host, t) for t in search.timed)
        if not search.bands or all(t.mem_get_info_total_mib is None for t in mine):
            continue
        one = Searched(attempt.id, attempt.host, search, tuple(t for t in mine if t.counts),
                       tuple(t for t in mine if not t.counts))
        for table, key in ((found, search.profile), (on_host, (search.profile, attempt.host))):
            older = table.get(key)
            if older is None or _counts(older.search) <= _counts(search):
                table[key] = one
    return {name: replace(one, timed=tuple(timed[name]), elsewhere=tuple(
                other for (profile, host), other in on_host.items()
                if profile == name and host != one.host))
            for name, one in found.items()}


@dataclass(frozen=True)
class MachineAgreement:
    """One profile searched on two hosts: where their bands' A differ, by count."""

    profile: str
    hosts: tuple[str, str]  # the newest search's host first
    counts: tuple[int, ...]  # the counts both banded with an A
    apart_mib: dict[int, int]  # count -> the newest's A less the other's, where not 0


def machine_agreement(searches: dict[str, Searched]) -> list[MachineAgreement]:
    """Each profile banded on more than one host: its newest search against the newest on each
    other host, count by count. A pool limit is torch's own, so the bands should agree; how far
    they do not is the machine's share."""
    out = []
    for profile, found in searches.items():
        mine = {b.reference_count: b.fits_at_mib for b in found.search.bands
                if b.fits_at_mib is not None}
        for other in found.elsewhere:
            theirs = {b.reference_count: b.fits_at_mib for b in other.search.bands
                      if b.fits_at_mib is not None}
            shared = tuple(sorted(mine.keys() & theirs.keys()))
            if shared:
                out.append(MachineAgreement(
                    profile, (found.host, other.host), shared,
                    {n: mine[n] - theirs[n] for n in shared if mine[n] != theirs[n]}))
    return out


def cut_searches(evidence: Evidence, configs: str, banded: set[str]) -> list[str]:
    """The searches of the model built from `configs` that were cut before their first band and
    never banded since (`banded`: the profiles newest_searches found), in words: what they
    tried, so a stopped run is said, not lost."""
    out = []
    for attempt, search, mine in _searches_of(evidence, configs):
        if search.bands or search.profile in banded or not mine:
            continue
        counts = sorted({t.reference_count for t in mine})
        walls = [t.wall_s for t in mine]
        out.append(f"`{search.profile}` in {attempt.id}: {len(mine)} trial(s) at "
                   f"{', '.join(map(str, counts))} reference(s), "
                   f"{min(walls):.0f}–{max(walls):.0f} s each")
    return out


def never_searched(evidence: Evidence, configs: str, listed: list[str]) -> list[str]:
    """The profiles of `listed` (those of the hosts the model was searched on) that no search of
    the model built from `configs` has a record of: what is set up and not yet measured."""
    tried = {search.profile for _, search, _ in _searches_of(evidence, configs)}
    return [p for p in listed if p not in tried]


def _counts(search: ProfileSearch) -> set[int]:
    return {b.reference_count for b in search.bands if b.stopped is None}


# A band wider than this many steps of the grid, after its repeats, is the boundary's noise.
NOISE_STEPS = 2


def noisy_bands(found: Searched) -> list[str]:
    """Each band wider than NOISE_STEPS of its grid, with the trials of its count between and at
    its edges: noise the repeats did not settle, shown rather than averaged away."""
    step = found.search.search.resolution_mib
    out = []
    for band in sorted(found.search.bands, key=lambda b: b.reference_count):
        width = band.width_mib
        if width is None or width <= NOISE_STEPS * step:
            continue
        inside = [t for t in found.trials if t.reference_count == band.reference_count
                  and band.fails_at_mib <= t.limit_mib <= band.fits_at_mib]
        out.append(f"`{found.search.profile}`, {band.reference_count} reference(s): "
                   f"{band.fails_at_mib:,}–{band.fits_at_mib:,} is {width:,} MiB wide, more than "
                   f"{NOISE_STEPS} steps of {step} MiB; its trials there: "
                   + ", ".join(f"{t.limit_mib:,} {t.outcome}"
                               for t in sorted(inside, key=lambda t: t.limit_mib)))
    return out


def reference_contradictions(found: Searched) -> list[str]:
    """Trials where more references fit in less: a count that fit at a limit at or below one
    where a smaller count failed. The search takes more references never to need less (a
    count's B bounds the next); each such pair says the boundary is noisier than that, and is
    shown, never averaged away. One line per such trial: repeats at one limit say it again."""
    out = []
    failed: dict[int, int] = {}  # count -> the highest limit it failed at
    for trial in found.trials:
        if trial.outcome == "oom":
            failed[trial.reference_count] = max(failed.get(trial.reference_count, 0),
                                                trial.limit_mib)
    for trial in found.trials:
        if trial.outcome != "fit":
            continue
        for smaller, limit in sorted(failed.items()):
            if smaller < trial.reference_count and trial.limit_mib <= limit:
                out.append(f"`{found.search.profile}`: {trial.reference_count} reference(s) fit "
                           f"at {trial.limit_mib:,} MiB, where {smaller} failed at {limit:,}")
                break
    return out


@dataclass(frozen=True)
class BandVerdict:
    """One card, profile and reference count."""

    verdict: str  # fits, at the margin, does not fit, not searched so high, not searched so low
    margin_mib: int | None = None  # usable - A, where it fits or is at the margin
    shortfall_mib: int | None = None  # A - usable, where it does not fit or is at the margin


def band_verdict(band: CapacityBand, usable_mib: int, floor_mib: int) -> BandVerdict:
    """The rule: at or above A fits, at or below B does not, between them at the margin. A pool
    the search never reached (above its ceiling with no A, below its floor with no B) is said
    as such, never guessed at."""
    a, b = band.fits_at_mib, band.fails_at_mib
    if a is not None and usable_mib >= a:
        return BandVerdict("fits", margin_mib=usable_mib - a)
    if b is not None and usable_mib <= b:
        return BandVerdict("does not fit", shortfall_mib=(a if a is not None else b) - usable_mib)
    if a is None:
        return BandVerdict("not searched so high", shortfall_mib=None)
    if b is None:
        return BandVerdict("not searched so low" if usable_mib < floor_mib else "at the margin",
                           shortfall_mib=a - usable_mib)
    return BandVerdict("at the margin", margin_mib=usable_mib - b, shortfall_mib=a - usable_mib)


@dataclass(frozen=True)
class CardProfile:
    """One card and profile over the reference counts its search ran."""

    profile: str
    verdicts: dict[int, BandVerdict]
    host_ram: str | None  # None: the card's host RAM is not stated; else what the runs say

    @property
    def fitting(self) -> tuple[int, ...]:
        return tuple(n for n, v in self.verdicts.items() if v.verdict == "fits")


def host_ram_reading(runs: list[ProfileRun], profile: str, host_ram_mib: int | None) -> str | None:
    """What the card's host RAM says of a profile: None where it is not stated; "within" where a
    run held no more; "over" where runs held more or were killed at the cap; "not measured"."""
    if host_ram_mib is None:
        return None
    mine = [r for r in runs if r.profile == profile]
    if any(r.host_ram.within(host_ram_mib) and not r.host_ram.killed for r in mine):
        return "within"
    if any(r.host_ram.killed or r.host_ram.peak_mib is not None for r in mine):
        return "over"
    return "not measured"


def card_profiles(card: Card, searches: dict[str, Searched], runs: list[ProfileRun],
                  host_ram_mib: int | None) -> list[CardProfile]:
    """Every searched profile's verdicts on this card."""
    out = []
    usable = card.usable_pool_mib
    for profile, found in searches.items():
        grid = found.search.search
        verdicts = {b.reference_count: band_verdict(b, usable, grid.floor_mib)
                    for b in found.search.bands if b.stopped is None}
        out.append(CardProfile(profile, dict(sorted(verdicts.items())),
                               host_ram_reading(runs, profile, host_ram_mib)))
    return out


def sweep_reading(fits: bool, pool_mib: float, band: CapacityBand) -> str:
    """A sweep cell against its band: a fit needs A at or below its pool, an OOM B at or above
    it ("agrees"). A cell whose pool lies between B and A is "uncertain" (the band says either
    can happen there); one on the wrong side of the band "contradicts" it."""
    a, b = band.fits_at_mib, band.fails_at_mib
    if fits:
        if a is not None and pool_mib >= a:
            return "agrees"
        return "contradicts" if b is not None and pool_mib <= b else "uncertain"
    if b is not None and pool_mib <= b:
        return "agrees"
    return "contradicts" if a is not None and pool_mib >= a else "uncertain"


@dataclass(frozen=True)
class SweepCheck:
    """A sweep cell held against its profile's band."""

    profile: str
    reference_count: int
    cap_mib: int
    pool_mib: float  # torch's pool under the cap: the cap less the runner's CUDA context
    fits: bool
    band: CapacityBand
    reading: str

    def text(self) -> str:
        a = "none" if self.band.fits_at_mib is None else f"{self.band.fits_at_mib:,}"
        b = "none" if self.band.fails_at_mib is None else f"{self.band.fails_at_mib:,}"
        return (f"`{self.profile}` at {self.reference_count} reference(s) "
                f"{'fit' if self.fits else 'failed'} under the {self.cap_mib:,} MiB cap, a pool "
                f"of {self.pool_mib:,.0f} MiB; its band: fails at {b}, fits at {a} MiB")


def sweep_checks(runs: list[ProfileRun], searches: dict[str, Searched]) -> list[SweepCheck]:
    """Every sweep cell with a recorded pool and a band, held against the band."""
    out = []
    for run in runs:
        searched = searches.get(run.profile)
        if searched is None or run.pool_mib is None or run.cap_mib is None:
            continue
        for cell in run.cells:
            band = searched.band(cell.reference_count)
            if band is None or band.stopped or cell.outcome not in ("ok", "oom"):
                continue
            fits = cell.outcome == "ok"
            out.append(SweepCheck(run.profile, cell.reference_count, run.cap_mib, run.pool_mib,
                                  fits, band, sweep_reading(fits, run.pool_mib, band)))
    return out
