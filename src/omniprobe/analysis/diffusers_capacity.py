"""What the Diffusers engine's evidence says of capacity: per host, cap and profile, which reference
counts fit, at what peak, and the OOM of those that did not; the smallest swept cap that fits
each count; and the conditioning KV cache, measured in bytes, beside what the architecture implies.

Random-weight evidence counts for capacity only: a cell fits when every request of it is ok and
no emulation breach was recorded; no output structure or PSNR is read from it, and its walls are
the measuring GPU's, a relative speed and never a card's seconds. A card whose
host's RAM is stated fits only where both fit: the GPU pool, and the run's host footprint against
that RAM (classify/host_ram.py's host_ram_fit: pinned memory must fit in RAM, and swap or zram is
never counted). A failure in upstream code that is no lack of memory (a cause of kind server or
environment) is never the card's answer: its cell is not measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe.classify.failure_cause import effective_cause
from omniprobe.classify.host_ram import HostRamFit, host_ram_fit
from omniprobe.classify.outcome import cell_outcome
from omniprobe.config.fixtures import FixtureSuite
from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.load import Evidence, LoadedAttempt
from omniprobe.evidence.models.offline import OfflineRequest, OfflineRun
from omniprobe.evidence.repeats import standing


@dataclass(frozen=True)
class CapacityCell:
    """A cell as the glossary has it: one fixture of a profile's run (so one reference count,
    at the run's cap), over its requests."""

    reference_count: int
    fixture: str
    outcome: str  # the worst request's: oom before error before timeout before ok
    fits: bool
    peak_mib: float | None  # the highest reserved peak of its requests (a failed one's too)
    peak_allocated_mib: float | None
    oom_requested: str | None
    breached: bool
    upstream_failure: str | None = None  # where upstream code failed for no lack of memory
    wall_s: float | None = None  # the slowest ok request's: the measuring GPU's, never the card's


@dataclass(frozen=True)
class HostRam:
    """What a profile run's runners held in host memory, and under what cap."""

    cap_mib: int | None = None  # the cgroup's memory.max; None: host RAM was not emulated
    peak_mib: float | None = None  # the most held: runner peak RSS or the cgroup's peak
    killed: bool = False  # the kernel killed a runner at the cap (a failure the host's)
    pinned_mib: float | None = None  # the most page-locked, at the build or a request
    build_peak_mib: float | None = None  # the three figures of the load path, apart
    steady_mib: float | None = None
    request_peak_mib: float | None = None  # sampled beside the requests

    def fit(self, host_ram_mib: int) -> HostRamFit:
        return host_ram_fit(host_ram_mib, footprint_mib=self.peak_mib,
                            pinned_mib=self.pinned_mib, cap_mib=self.cap_mib, killed=self.killed)

    def within(self, host_ram_mib: int) -> bool:
        """The run's host footprint fits a host with `host_ram_mib` of RAM."""
        return self.fit(host_ram_mib).fits is True


@dataclass(frozen=True)
class ProfileRun:
    host: str
    cap_mib: int | None
    profile: str
    attempt: str
    cells: tuple[CapacityCell, ...]
    init_outcome: str  # "ready", or how the build ended
    host_ram: HostRam = HostRam()
    pool_mib: float | None = None  # torch's pool under the cap (the cap less the CUDA context)
    init_upstream_failure: str | None = None  # a build that failed in upstream code, no OOM
    # How it was built (DiffusersBuild.build_path): its own build's, else, for a build that did
    # not finish, the one its attempt's other builds took; None: not on record (a build made
    # before the streamed one, which held the whole bf16 model on the host at once).
    build_path: str | None = None

    def cell(self, refs: int) -> CapacityCell | None:
        return next((c for c in self.cells if c.reference_count == refs), None)

    @property
    def killed_by_whole_build(self) -> bool:
        """Killed at the host's RAM while built by the random build that held the whole bf16
        model at once: the harness's failure, not the card's (a streamed build re-measures it)."""
        return self.init_outcome != "ready" and self.host_ram.killed and self.build_path is None

    @property
    def fitting(self) -> tuple[int, ...]:
        return tuple(c.reference_count for c in self.cells if c.fits)


def _cell(refs: int, records: list[OfflineRequest]) -> CapacityCell:
    outcome = cell_outcome([r.outcome for r in records])  # the worst request decides
    breached = any(r.emulation_breach is not None for r in records)
    peaks = [r.peak_mib for r in records if r.peak_mib is not None]
    allocated = [r.peak_allocated_mib for r in records if r.peak_allocated_mib is not None]
    oom = next((r.oom for r in records if r.oom is not None), None)
    upstream = next((c.reason for c in (upstream_cause(r.outcome, r.cause) for r in records)
                     if c is not None), None)
    walls = [r.wall_s for r in records if r.outcome == "ok" and r.wall_s is not None]
    return CapacityCell(refs, records[0].fixture, outcome, outcome == "ok" and not breached,
                        max(peaks, default=None), max(allocated, default=None),
                        oom.requested if oom else None, breached, upstream,
                        max(walls, default=None))


def upstream_cause(outcome: str, cause):
    """A failure's cause where it is upstream code's or the environment's, no lack of memory of
    the card or its host; None otherwise."""
    found = effective_cause(outcome, cause)
    return found if found is not None and found.kind in ("server", "environment") else None


def profile_runs(attempt: LoadedAttempt, fixtures: FixtureSuite) -> list[ProfileRun]:
    """The attempt's profiles, each with its cells by reference count, in the order they ran."""
    prov = attempt.meta.provenance
    cap = prov.cap_mib if prov.kind == "emulated" else None
    runs = []
    paths = {row.build.build_path for row in attempt.offline if row.build is not None} - {None}
    names = dict.fromkeys([r.configuration for r in attempt.offline if r.ran]
                          + [r.configuration for r in attempt.offline_requests])
    for name in names:
        mine = [r for r in standing(attempt.offline_requests) if r.configuration == name]
        by_refs: dict[int, list[OfflineRequest]] = {}
        for record in mine:
            by_refs.setdefault(fixtures.get(record.fixture).reference_count, []).append(record)
        rows = [r for r in attempt.offline if r.configuration == name]
        failed = next((r.init_failed for r in rows if r.init_failed), None)
        allowed = [p.allowed_mib for row in rows for t in row.timelines if t.emulation
                   for p in t.emulation.capped]
        init_upstream = upstream_cause(failed, rows[0].init.cause) if failed else None  # one run
        known = {r.build.build_path for r in rows if r.build is not None} - {None} or paths
        path = next(iter(known)) if len(known) == 1 else None
        runs.append(ProfileRun(attempt.host, cap, name, attempt.id,
                               tuple(_cell(n, by_refs[n]) for n in sorted(by_refs)),
                               failed or "ready",
                               _host_ram(rows, mine), min(allowed, default=None),
                               init_upstream.reason if init_upstream else None, path))
    return runs


def _most(values) -> float | None:
    return max((v for v in values if v is not None), default=None)


def held_mib(cgroup_peaks: list[float | None], resident_mib: list[float | None]
             ) -> float | None:
    """The most a run held in host memory. Under a cgroup, the cgroup's own peak where it was
    read: it is what the cap limits and the kernel kills at, while resident memory also counts
    shared file pages (libraries) charged to no cgroup of the run's. Without one, the most
    resident memory any reading saw."""
    charged = _most(cgroup_peaks)
    return charged if charged is not None else _most(resident_mib)


def _host_ram(rows: list[OfflineRun], records: list[OfflineRequest]) -> HostRam:
    checks = [h for row in rows for h in row.host_ram]
    builds = [row.build for row in rows if row.build is not None]
    resident = [r.max_rss_mib for r in records] + [r.host_peak_mib for r in records]
    resident += [b.build_host_peak_mib for b in builds]
    causes = [x.cause for x in [*(r.init for r in rows if r.init), *records]
              if x.cause is not None]
    return HostRam(
        max((h.cap_mib for h in checks), default=None),
        held_mib([h.peak_mib for h in checks], resident),
        any(h.oom_kills for h in checks) or any(c.kind == "host" for c in causes),
        _most([b.pinned_host_mib for b in builds] + [r.pinned_host_peak_mib for r in records]),
        _most(b.build_host_peak_mib for b in builds), _most(b.steady_host_mib for b in builds),
        _most(r.host_peak_mib for r in records))


def host_runs(host: str, evidence: Evidence, fixtures: FixtureSuite) -> list[ProfileRun]:
    """Every profile run of a Diffusers host; where a cap and profile ran in several attempts
    under the same host RAM, the newest speaks for them, as a re-run supersedes (a run under a
    host RAM cap answers another question than one without, so both stay)."""
    newest: dict[tuple[int | None, str, int | None], ProfileRun] = {}
    for attempt in sorted(evidence.for_host(host, include_emulated=True), key=lambda a: a.id):
        for run in profile_runs(attempt, fixtures):
            newest[run.cap_mib, run.profile, run.host_ram.cap_mib] = run
    return sorted(newest.values(),
                  key=lambda r: (r.cap_mib or 0, r.host_ram.cap_mib or 0, r.profile))


# --- the smallest card per profile ------------------------------------------------------------


def gpu_runs(runs: list[ProfileRun]) -> list[ProfileRun]:
    """The runs that say something of the GPU's memory: a run the kernel killed at the host's
    RAM before any request measured anything answers for the host, not the card."""
    return [r for r in runs if r.cells or not r.host_ram.killed]


def model_sweep_runs(hosts: HostsConfig, evidence: Evidence, fixtures: FixtureSuite,
                     configs: str) -> list[ProfileRun]:
    """The emulated cards' sweep runs of the model built from `configs` (its hosts' committed
    folder) that say something of the GPU: what its capacity search and answers are held to."""
    return gpu_runs([run for key, host in hosts.hosts.items()
                     if host.emulation is not None and host.diffusers is not None
                     and host.diffusers.configs == configs
                     for run in host_runs(key, evidence, fixtures)])


@dataclass(frozen=True)
class MinCap:
    """The smallest swept cap at which a reference count fits, as precise as the sweep allows:
    `at_most` the smallest cap that fit (None: none did), `above` the largest cap below it that
    did not (None: nothing smaller was tried)."""

    at_most_mib: int | None
    above_mib: int | None

    def text(self) -> str:
        gib = lambda mib: f"{mib / 1024:g}"  # noqa: E731
        if self.at_most_mib is None:
            return f"> {gib(self.above_mib)}" if self.above_mib is not None else "not run"
        if self.above_mib is None:
            return f"≤ {gib(self.at_most_mib)}"
        return f"{gib(self.above_mib)}–{gib(self.at_most_mib)}"


def min_cap(results: dict[int, bool]) -> MinCap:
    """From {cap MiB: fits} of one profile and reference count: the smallest cap that fits and
    the largest below it that does not. A count that fits at a cap and not at a larger one is
    read at the smallest that fits."""
    if not results:
        return MinCap(None, None)
    fitting = sorted(c for c, fits in results.items() if fits)
    if not fitting:
        return MinCap(None, max(results))
    smallest = fitting[0]
    below = [c for c, fits in results.items() if not fits and c < smallest]
    return MinCap(smallest, max(below, default=None))


def min_caps(runs: list[ProfileRun], profile: str) -> dict[int, MinCap]:
    """Reference count -> its MinCap, over one profile's runs at every cap."""
    swept: dict[int, dict[int, bool]] = {}
    for run in runs:
        if run.profile != profile or run.cap_mib is None:
            continue
        for cell in run.cells:
            swept.setdefault(cell.reference_count, {})[run.cap_mib] = cell.fits
    return {refs: min_cap(results) for refs, results in sorted(swept.items())}


# --- the conditioning KV cache ---------------------------------------------------------------


@dataclass(frozen=True)
class KvMeasure:
    """The conditioning cache of one request whose prefill filled every layer."""

    profile: str
    fixture: str
    reference_count: int
    output_resolution: int
    bytes: int
    prefix_tokens: int
    prompt_text_tokens: int | None = None  # None: the record predates counting them

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / self.prefix_tokens


def kv_measures(runs_attempts: list[LoadedAttempt], fixtures: FixtureSuite,
                resolutions: dict[str, int]) -> list[KvMeasure]:
    """Every complete cache measured (a failed prefill's partial cache is left out), one per
    profile and fixture: the latest attempt's first seed, so a re-run that counts the prompt's
    text tokens stands over one that did not; `resolutions`: each profile's output_resolution."""
    found: dict[tuple[str, str], KvMeasure] = {}
    for attempt in sorted(runs_attempts, key=lambda a: a.id, reverse=True):
        for r in attempt.offline_requests:
            if (r.kv_cache_bytes is None or r.prefix_tokens in (None, 0)
                    or r.kv_cache_layers != r.kv_cache_layers_total):
                continue
            found.setdefault((r.configuration, r.fixture), KvMeasure(
                r.configuration, r.fixture, fixtures.get(r.fixture).reference_count,
                resolutions[r.configuration], r.kv_cache_bytes, r.prefix_tokens,
                r.prompt_text_tokens))
    return sorted(found.values(), key=lambda m: (m.output_resolution, m.profile,
                                                 m.reference_count))


@dataclass(frozen=True)
class KvPerReference:
    output_resolution: int
    profile: str
    reference_count: int
    tokens_per_reference: float  # (prefix tokens - the request's own prompt text tokens) / n
    bytes_per_reference: float  # the same share of the cache's bytes


def kv_per_reference(measures: list[KvMeasure]) -> list[KvPerReference]:
    """Each request's references' share of its cache, per reference: its prefix less its own
    prompt's text tokens. Never against another fixture's request: each fixture has its own
    prompt, so a difference between two would hold their prompts' difference too. A record that
    does not count its prompt's tokens gives no share."""
    return [KvPerReference(m.output_resolution, m.profile, m.reference_count,
                           (m.prefix_tokens - m.prompt_text_tokens) / m.reference_count,
                           m.bytes_per_token * (m.prefix_tokens - m.prompt_text_tokens)
                           / m.reference_count)
            for m in measures if m.reference_count > 0 and m.prompt_text_tokens is not None]


# --- the card's verdict, capacity only -------------------------------------------------------

CardVerdict = str  # "fits", "fits the GPU only", "does not fit", "not measured"


@dataclass(frozen=True)
class Fit:
    profile: str
    peak_mib: float | None
    host_ram_peak_mib: float | None = None
    host: HostRamFit | None = None  # against the card's host RAM, where it is stated


@dataclass(frozen=True)
class CardCapacity:
    """An emulated card's capacity verdict for the target reference count, from random weights:
    which profiles fit it, at what peak; never a statement about output or speed."""

    host: str
    cap_mib: int | None
    target: int
    verdict: CardVerdict
    fits: tuple[Fit, ...]
    largest_fit: dict[str, int]  # profile -> the most references it fit at this cap (-1: none)
    gpu_only: tuple[Fit, ...] = ()  # fit the GPU cap, holding more host RAM than the host has
    host_ram_mib: int | None = None


def card_capacity(host: str, runs: list[ProfileRun], cap_mib: int | None, target: int,
                  host_ram_mib: int | None = None) -> CardCapacity:
    """The rule: at the card's own cap, a profile fits the target when its target-count cell
    fits and, where the card's host RAM is stated (`host_ram_mib`), its run stayed within it; the
    card fits when some profile does. A profile that built nothing (the build failed, the kernel
    killed it at the host's RAM) fits no count. Not measured: no profile asked for the target."""
    mine = [r for r in runs if r.cap_mib == cap_mib]
    gpu_fits = [(r, Fit(r.profile, r.cell(target).peak_mib, r.host_ram.peak_mib,
                        None if host_ram_mib is None else r.host_ram.fit(host_ram_mib)))
                for r in mine if r.cell(target) is not None and r.cell(target).fits]
    fits = tuple(f for r, f in gpu_fits if host_ram_mib is None or r.host_ram.within(host_ram_mib))
    gpu_only = tuple(f for _, f in gpu_fits if f not in fits)
    # An upstream failure that is no lack of memory asks nothing of the card, nor a kill the
    # whole-model random build caused.
    asked = any((r.cell(target) is not None and r.cell(target).upstream_failure is None)
                or (r.init_outcome != "ready" and r.init_upstream_failure is None
                    and not r.killed_by_whole_build) for r in mine)
    verdict = ("fits" if fits else "fits the GPU only" if gpu_only
               else "does not fit" if asked else "not measured")
    return CardCapacity(host, cap_mib, target, verdict, fits,
                        {r.profile: max(r.fitting, default=-1) for r in mine}, gpu_only,
                        host_ram_mib)
