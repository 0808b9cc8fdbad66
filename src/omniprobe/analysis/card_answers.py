"""The answer per card and host: on this card, with this much host RAM, which searched profile
runs N reference images, with what margin, at what speed against the fastest that fits the GPU,
what it gives up, and how sure the answer is.

A profile runs on a card where both hold:
- the GPU: the card's usable pool is at or above the band's A by at least the band's own width
  (A less B; one grid step where nothing failed below A). Trials have moved by a band's width,
  so a pool nearer A than that is "at the margin", never a fit.
- the host: the profile's host need (the most its runner held at up to that many references,
  its page-locked bytes among them) is at most the host's RAM. Swap and zram are never counted:
  page-locked memory cannot go there, and the rest would page at every step.

Every cell carries a grade: "derived" from a band and the card's sourced figures, or "assumed",
naming each assumption it rests on (a card figure hosts.toml marks assumed, a host need taken
from another profile of the same placement). Relative speed is the measuring machine's, never
seconds for a card: from one timed request per profile at the same steps and count on one host,
where most searched profiles have one (`probe-capacity --speed-steps`; one without it ranks after
them), else from the search's own fitting trials at each count.
"""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe.analysis.calibration import placement
from omniprobe.analysis.capacity_bands import Searched, TimedKey
from omniprobe.analysis.diffusers_capacity import ProfileRun
from omniprobe.config.diffusers import DiffusersProfile
from omniprobe.evidence.models.capacity import CapacityBand
from omniprobe_engine.adapters import adapter_for
from omniprobe_engine.knobs import GROUP_OFFLOADS
from omniprobe_engine.kv_host import HOST_PLACEMENTS

RUNS, MARGIN, HOST_SHORT, HOST_UNKNOWN, NO_FIT, NOT_SEARCHED = (
    "runs", "at the margin", "host too small", "host need not measured", "does not fit",
    "not searched")


@dataclass(frozen=True)
class HostNeed:
    """What a profile's runner held in host memory, and where that was measured."""

    peak_mib: float
    pinned_mib: float
    measured_under: str  # the profile whose run recorded it
    same_placement: bool = False  # measured under another profile of the same placement

    @property
    def most_mib(self) -> float:
        """What the host must hold: the peak, or the page-locked bytes where they were more."""
        return max(self.peak_mib, self.pinned_mib)


@dataclass(frozen=True)
class Candidate:
    """One searched profile at one reference count."""

    profile: str
    band: CapacityBand
    resolution_mib: int  # the search's grid step
    wall_s: float | None  # the measuring machine's: its timed request, or its fastest fitting trial
    host: HostNeed | None
    gives_up: tuple[str, ...] = ()


@dataclass(frozen=True)
class CardFigures:
    name: str
    usable_mib: int
    assumed: tuple[str, ...] = ()  # the card's figures hosts.toml marks as assumed


@dataclass(frozen=True)
class GpuFit:
    reading: str  # RUNS, MARGIN or NO_FIT
    margin_mib: int | None  # usable less A (negative: short of A); None: no A


def gpu_fit(band: CapacityBand, usable_mib: int, resolution_mib: int) -> GpuFit:
    """The rule for the GPU: A plus the band's width fits; above B, or within the width above A,
    is at the margin; at or below B, or with no A found, does not fit."""
    a, b = band.fits_at_mib, band.fails_at_mib
    if band.stopped or a is None:
        return GpuFit(NO_FIT, None)
    width = band.width_mib if b is not None else resolution_mib
    margin = usable_mib - a
    if margin >= width:
        return GpuFit(RUNS, margin)
    if b is not None and usable_mib <= b:
        return GpuFit(NO_FIT, margin)
    return GpuFit(MARGIN, margin)


def host_fits(need: HostNeed | None, host_ram_mib: int) -> bool | None:
    """Whether the host's RAM holds the profile's need; None where the need is not measured."""
    if need is None:
        return None
    return need.most_mib <= host_ram_mib


@dataclass(frozen=True)
class Answer:
    card: str
    host_ram_mib: int
    count: int
    status: str
    profile: str | None = None
    margin_mib: int | None = None
    relative_speed: float | None = None  # its wall over the fastest GPU fit's; 1.0: the fastest
    gives_up: tuple[str, ...] = ()
    host_need_mib: float | None = None  # the chosen profile's, or the least any GPU fit needs
    assumptions: tuple[str, ...] = ()

    @property
    def grade(self) -> str:
        return "assumed" if self.assumptions else "derived"


def _fastest(found: list[Candidate]) -> Candidate:
    """The least wall first; a candidate without one after every timed one, by name."""
    return min(found, key=lambda c: (c.wall_s is None, c.wall_s or 0.0, c.profile))


def _assumptions(card: CardFigures, chosen: Candidate | None) -> tuple[str, ...]:
    out = list(card.assumed)
    if chosen is not None and chosen.host is not None and chosen.host.same_placement:
        out.append(f"host need measured under `{chosen.host.measured_under}`, same placement")
    return tuple(out)


def answer(card: CardFigures, host_ram_mib: int, count: int,
           candidates: list[Candidate]) -> Answer:
    """The answer for one card, host RAM and reference count over the searched profiles."""
    if not candidates:
        return Answer(card.name, host_ram_mib, count, NOT_SEARCHED,
                      assumptions=tuple(card.assumed))
    gpu = {c.profile: gpu_fit(c.band, card.usable_mib, c.resolution_mib) for c in candidates}
    on_gpu = [c for c in candidates if gpu[c.profile].reading == RUNS]
    both = [c for c in on_gpu if host_fits(c.host, host_ram_mib)]
    if both:
        chosen, fastest = _fastest(both), _fastest(on_gpu)
        speed = (round(chosen.wall_s / fastest.wall_s, 1)
                 if chosen.wall_s and fastest.wall_s else None)
        return Answer(card.name, host_ram_mib, count, RUNS, chosen.profile,
                      gpu[chosen.profile].margin_mib, speed, chosen.gives_up,
                      chosen.host.most_mib, _assumptions(card, chosen))
    marginal = [c for c in candidates
                if gpu[c.profile].reading == MARGIN and host_fits(c.host, host_ram_mib)]
    if marginal:
        chosen = max(marginal, key=lambda c: (gpu[c.profile].margin_mib or 0, c.profile))
        return Answer(card.name, host_ram_mib, count, MARGIN, chosen.profile,
                      gpu[chosen.profile].margin_mib, None, chosen.gives_up,
                      chosen.host.most_mib, _assumptions(card, chosen))
    # The GPU takes it (or nearly) and the host does not: the host is why nothing runs.
    measured = [c for c in candidates if gpu[c.profile].reading in (RUNS, MARGIN)
                and c.host is not None]
    if measured:
        least = min(measured, key=lambda c: (c.host.most_mib, c.profile))
        return Answer(card.name, host_ram_mib, count, HOST_SHORT, least.profile,
                      host_need_mib=least.host.most_mib,
                      assumptions=_assumptions(card, least))
    if on_gpu:
        return Answer(card.name, host_ram_mib, count, HOST_UNKNOWN, _fastest(on_gpu).profile,
                      assumptions=tuple(card.assumed))
    nearest = max(candidates, key=lambda c: (gpu[c.profile].margin_mib is not None,
                                            gpu[c.profile].margin_mib or 0, c.profile))
    return Answer(card.name, host_ram_mib, count, NO_FIT, nearest.profile,
                  gpu[nearest.profile].margin_mib, assumptions=tuple(card.assumed))


def host_memory_words(placement: str) -> str:
    """A host placement of the cache in words: 'packed pinned host memory'."""
    memory = HOST_PLACEMENTS[placement]
    return (f"{'packed ' if memory.packed else ''}{'pinned' if memory.pinned else 'pageable'} "
            "host memory")


# What a profile trades for its memory, in the words the answer gives; a profile's placement
# (where the weights live) is what it is, not what it gives up.
def gives_up(profile: DiffusersProfile, default_resolution: int) -> tuple[str, ...]:
    out = []
    # A pipeline that keeps no conditioning cache gives none up by running without one.
    if not profile.use_kv_cache and adapter_for(profile.pipeline).keeps_conditioning_cache:
        out.append("KV cache off")
    elif profile.kv_placement in HOST_PLACEMENTS:  # each step reads it across the bus
        out.append(f"KV cache in {host_memory_words(profile.kv_placement)}")
    if profile.vae_tiling:
        out.append("VAE tiled")
    if profile.quantize_dit:
        out.append("DiT int8")
    if profile.quantize_text_encoder:
        out.append("text encoder int8")
    size = profile.output_resolution
    if size is not None and size < default_resolution:
        out.append(f"references at {size}²")
    return tuple(out)


OFFLOAD_WORDS = {"none": "everything on the GPU", "model-cpu": "model CPU offload",
                 "group-leaf": "leaf offload", "group-block": "block offload"}


def settings_words(profile: DiffusersProfile, default_resolution: int) -> str:
    """A profile's settings in plain words: where the weights live and how torch allocates,
    then what it gives up."""
    where = OFFLOAD_WORDS[profile.offload]
    if profile.offload in GROUP_OFFLOADS and not profile.use_stream:
        where += " without streams"
    allocator = (f"allocator {profile.allocator}",) if profile.allocator else ()
    release = ("cache freed before the decode",) if profile.release_kv_before_decode else ()
    return ", ".join((where, *allocator, *release, *gives_up(profile, default_resolution)))


def search_host_figures(found: Searched, up_to: int | None = None) -> tuple[float, float] | None:
    """The most a profile's search runner held in host memory and, of it, page-locked: its build
    (by the streamed load path) and every trial and timed request after it, or those of up to
    `up_to` references (a host serving that many never meets a larger request's cache); None
    where the build recorded no page-locked bytes."""
    build = found.search.build
    if build is None or build.build_path is None or build.pinned_host_mib is None:
        return None
    requests = [r for r in (*found.trials, *found.set_aside, *found.search.timed)
                if up_to is None or r.reference_count <= up_to]
    peak = max((build.build_host_peak_mib or 0.0, build.steady_host_mib or 0.0,
                *(r.host_peak_mib or 0.0 for r in requests)))
    pinned = max((build.pinned_host_mib, *(r.pinned_host_peak_mib or 0.0 for r in requests)))
    return peak, pinned


def pinned_weights_mib(found: Searched) -> tuple[float, float] | None:
    """What a profile's build held page-locked and its weights' own bytes on the host, in MiB:
    group offload with streams keeps a pinned copy of every weight, so their ratio is how much
    each pinned block was rounded up (or, packed, what the slabs added). None where the build
    pinned nothing or did not count its weights."""
    build = found.search.build
    if build is None or not build.pinned_host_mib or not build.host_weights_mib:
        return None
    return build.pinned_host_mib, build.host_weights_mib


def first_request_pinned_mib(found: Searched, count: int) -> float | None:
    """The page-locked bytes of a timed request at `count` made first in its runner (no trial of
    the search shares its lifetime): torch keeps the pinned blocks of earlier requests cached,
    so a runner that ran smaller counts first holds more than the count needs."""
    lifetimes = {t.lifetime for t in (*found.trials, *found.set_aside)}
    first = [t.pinned_host_peak_mib for t in found.search.timed
             if t.reference_count == count and t.lifetime not in lifetimes
             and t.pinned_host_peak_mib is not None]
    return max(first, default=None)


def host_needs(runs: list[ProfileRun], profiles: dict[str, DiffusersProfile],
               searches: dict[str, Searched] | None = None,
               up_to: int | None = None) -> dict[str, HostNeed]:
    """Each profile's host need: the most a run or its search held (its own first, else those of
    another profile of the same placement); a search's, at up to `up_to` references where given
    (a sweep run's figures span its counts, so they count whole). Runs count whose build
    finished by the load path's streamed build and recorded its page-locked bytes: a run killed
    at a cap held at least the cap and recorded no need; a build that held the whole bf16 model
    at once is the harness's."""
    measured: dict[str, tuple[float, float]] = {}

    def add(profile: str, peak_mib: float, pinned_mib: float) -> None:
        old = measured.get(profile, (0.0, 0.0))
        measured[profile] = (max(old[0], peak_mib), max(old[1], pinned_mib))

    for run in runs:
        ram = run.host_ram
        if (run.init_outcome != "ready" or ram.killed or run.build_path is None
                or ram.peak_mib is None or ram.pinned_mib is None):
            continue
        add(run.profile, ram.peak_mib, ram.pinned_mib)
    for name, found in (searches or {}).items():
        figures = search_host_figures(found, up_to)
        if figures is not None:
            add(name, *figures)
    out = {}
    for name, profile in profiles.items():
        if name in measured:
            out[name] = HostNeed(*measured[name], measured_under=name)
            continue
        same = [(figures, other) for other, figures in sorted(measured.items())
                if other in profiles and placement(profiles[other]) == placement(profile)]
        if same:
            figures, other = max(same, key=lambda s: (s[0][0], s[1]))
            out[name] = HostNeed(*figures, measured_under=other, same_placement=True)
    return out


def fastest_fit_s(found: Searched, count: int) -> float | None:
    """The least wall of a counted trial that fit at this count."""
    return min((t.wall_s for t in found.trials if t.reference_count == count
                and t.outcome == "fit" and t.wall_s is not None), default=None)


def timed_basis(searches: dict[str, Searched]) -> TimedKey | None:
    """The (host, steps, reference count) at which the most profiles with a band have a timed
    request that fit, then the most steps: one request each on one machine, so their walls
    compare (a wall is its machine's); a profile without one there ranks after every timed one.
    None where no profile has one, and the trials' walls rank instead. A search cut before its
    first band ranks nowhere."""
    held: dict[TimedKey, int] = {}
    for found in searches.values():
        if found.search.bands:
            for key in found.timed_fits():
                held[key] = held.get(key, 0) + 1
    return max(held, key=lambda k: (held[k], k[1], k[2], k[0])) if held else None


def untimed_at(basis: TimedKey, searches: dict[str, Searched]) -> list[str]:
    """The profiles with a band that have no timed request at `basis`."""
    return [name for name, found in searches.items()
            if found.search.bands and basis not in found.timed_fits()]


def candidates_at(count: int, searches: dict[str, Searched],
                  profiles: dict[str, DiffusersProfile], needs: dict[str, HostNeed],
                  default_resolution: int,
                  timed: TimedKey | None = None) -> list[Candidate]:
    """The searched profiles banded at this count; their walls from the timed requests at
    `timed` (host, steps, count) where given (None for a profile without one), else from their
    fitting trials at this count."""
    out = []
    for name, found in searches.items():
        band = found.band(count)
        if band is None or name not in profiles:
            continue
        if timed is None:
            wall = fastest_fit_s(found, count)
        else:
            request = found.timed_fits().get(timed)
            wall = None if request is None else request.wall_s
        out.append(Candidate(name, band, found.search.search.resolution_mib, wall,
                             needs.get(name), gives_up(profiles[name], default_resolution)))
    return out
