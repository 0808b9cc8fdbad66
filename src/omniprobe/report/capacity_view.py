"""The report's capacity-search part of the Diffusers section: the smallest pool per profile and
reference count as its band, each card's verdict from its own usable pool, the sweep held
against the bands, and the figure; every figure from evidence and hosts.toml, every comparison
made in analysis/capacity_bands.py."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from omniprobe.analysis.capacity_bands import (
    BandVerdict,
    CardProfile,
    MachineAgreement,
    Searched,
    card_profiles,
    cut_searches,
    machine_agreement,
    never_searched,
    noisy_bands,
    reference_contradictions,
    sweep_checks,
)
from omniprobe.analysis.card_answers import pinned_weights_mib
from omniprobe.analysis.diffusers_capacity import ProfileRun
from omniprobe.analysis.knob_deltas import knob_deltas
from omniprobe.config.cards import Card
from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.models.capacity import (
    GRID_FLAGS,
    CapacityBand,
    TimedRequest,
    given_grid_flags,
)
from omniprobe.evidence.validate import Loaded
from omniprobe.report.filters import names
from omniprobe.report.knobs_view import KnobRow, SpillLine, knob_rows, spill_line
from omniprobe.report.paths import CAPACITY_DIR
from omniprobe.report.pool_svg import CardLine, PoolLine, render_pool_svg

FIGURE = CAPACITY_DIR / "diffusers-min-pool.svg"


def band_cell(band: CapacityBand | None) -> str:
    """B–A in MiB; a B not tried at this count (the previous count's) in parentheses."""
    if band is None:
        return "—"
    if band.stopped:
        return f"no band ({band.stopped})"
    b = "—" if band.fails_at_mib is None else f"{band.fails_at_mib:,}"
    if band.fails_at_inferred:
        b = f"({b})"
    a = f"> {band.fails_at_mib:,}" if band.fits_at_mib is None else f"{band.fits_at_mib:,}"
    return f"{b}–{a}" if band.fits_at_mib is not None else a


@dataclass(frozen=True)
class PoolRow:
    profile: str
    gpu: str  # the GPU its newest search ran on: its trials' and timed requests' machine
    cells: list[str]  # by reference count
    trials: int  # counted toward its bands
    set_aside: int  # recorded, never counted (started dirty, or an error right after a failure)
    starts: str  # whether the trials recorded what they started with
    runners: int
    saved: int
    gpu_s: str  # the curve's GPU seconds, the build included
    timed: str  # its timed requests (the measuring GPU's seconds), or "—"


def timed_cell(timed: list[TimedRequest]) -> str:
    """Each timed request: its steps and count, then its wall and where it went (the encodes and
    the first step, each later step, the decode), in the measuring GPU's seconds."""
    def one(t: TimedRequest) -> str:
        head = (f"{t.num_inference_steps} steps, {t.reference_count} "
                f"ref{'' if t.reference_count == 1 else 's'}: ")
        if t.outcome != "fit":
            return head + t.outcome
        parts = [f"{s:.2f} s {what}" for what, s in (
            ("to step 1's end", t.first_step_end_s), ("a step after", t.step_after_first_s),
            ("decode", t.decode_s)) if s is not None]
        return head + f"{t.wall_s:.1f} s" + (f" ({', '.join(parts)})" if parts else "")

    return "; ".join(one(t) for t in timed) or "—"


@dataclass(frozen=True)
class CardRow:
    key: str  # hosts.toml's [cards] name
    card: str
    total: str  # memory.total and its source's kind
    overhead: str
    other: str
    usable_mib: int
    host_ram: str  # what the card's host RAM says, where its host states it
    cells: list[str]  # by profile: what fits, with the margin


@dataclass(frozen=True)
class CapacitySearchView:
    attempts: list[str]
    host: str  # the GPUs the searches ran on, e.g. "NVIDIA H200"
    grid: str  # "4,096–32,768 MiB every 256 MiB, 2 repeat(s) at each side"
    steps: int
    sizes: str
    ref_headers: list[str]
    profiles: list[str]
    rows: list[PoolRow]
    cards: list[CardRow]
    checked: int
    readings: dict[str, int]  # agrees / uncertain / contradicts -> cells
    disagreements: list[str]  # every cell that does not agree, in words
    contradictions: list[str]  # trials where more references fit in less, each said once
    contradicting_trials: int  # how many trials those are (repeats at one limit included)
    noise: list[str]  # bands wider than two steps of the grid, with their trials
    machines: list[str]  # profiles searched on two machines: how far their bands came apart
    machines_brief: str | None  # the same in a few words; None: every profile on one machine
    b_inferred: bool  # some band's B is the previous count's (shown in parentheses)
    cut: list[str]  # searches stopped before their first band, with what they tried
    unsearched: list[str]  # profiles of the searching hosts no search has a record of
    unsearched_swept: list[str]  # those of them the emulated cards' sweeps ran
    pinned_weights: list[str]  # page-locked at build against the weights' bytes, in words
    knobs: list[KnobRow]  # what each setting buys against its searched base
    spill: SpillLine | None  # the cache in pinned host memory against it on the GPU
    figure_path: str
    figure_svg: str


def verdict_words(n: int, v: BandVerdict) -> str:
    if v.verdict == "fits":
        return f"{n}: fits, {v.margin_mib:,} spare"
    if v.verdict == "at the margin":
        return f"{n}: margin, {v.shortfall_mib:,} under A"
    if v.verdict == "does not fit":
        return f"{n}: no, {v.shortfall_mib:,} short"
    return f"{n}: {v.verdict}"


def host_ram_words(found: list[CardProfile], host_ram_gib: str | None) -> str:
    """The card's host RAM beside the GPU's answer: a fit needs both."""
    if host_ram_gib is None:
        return "not stated"
    readings = {c.host_ram for c in found}
    if readings == {"over"}:
        return (f"{host_ram_gib} GiB: every searched profile was killed at it or held more")
    within = [c.profile for c in found if c.host_ram == "within"]
    if within:
        return f"{host_ram_gib} GiB: within it under " + ", ".join(f"`{p}`" for p in within)
    return f"{host_ram_gib} GiB: not measured"


def card_cell(found: CardProfile) -> str:
    """What fits, then each count that does not, with the margin of the largest that does."""
    if not found.verdicts:
        return "—"
    fitting = found.fitting
    head = (f"0–{fitting[-1]}" if fitting and list(fitting) == list(range(fitting[-1] + 1))
            else ", ".join(map(str, fitting)) if fitting else "none fits")
    largest = found.verdicts[fitting[-1]] if fitting else None
    parts = [head + (f", {largest.margin_mib:,} spare" if largest is not None else "")]
    parts += [verdict_words(n, v) for n, v in found.verdicts.items() if v.verdict != "fits"]
    return "; ".join(parts)


def _source(mib: int, card: Card, field: str) -> str:
    return f"{mib:,} ({getattr(card, field).kind})"


def capacity_search_view(loaded: Loaded, runs: list[ProfileRun],
                         host_ram_of: dict[str, int | None],
                         searches: dict[str, Searched], model: str, configs: str,
                         figure: Path = FIGURE) -> CapacitySearchView | None:
    """None where no capacity search is on record. `runs`: the emulated cards' sweep runs;
    `host_ram_of`: a card's host RAM (MiB) where its host states it; `configs`: the model's
    folder; `figure`: where its figure goes (one per model)."""
    hosts: HostsConfig = loaded.hosts
    if not searches:
        return None
    order = [p for p in hosts.diffusers_profiles if p in searches]
    counts = sorted({b.reference_count for s in searches.values() for b in s.search.bands})
    cells = {p: [band_cell(searches[p].band(n)) for n in counts] for p in order}  # table, figure
    gpu_of = {name: host.gpu for name, host in hosts.hosts.items()}
    rows = [PoolRow(p, gpu_of[searches[p].host], cells[p],
                    sum(b.trials for b in searches[p].search.bands),
                    len(searches[p].set_aside), searches[p].start_figures(), searches[p].runners,
                    sum(b.requests_saved for b in searches[p].search.bands),
                    f"{searches[p].search.gpu_s:.0f}" if searches[p].search.gpu_s else "—",
                    timed_cell(searches[p].search.timed))
            for p in order]
    cards = []
    for key, card in hosts.cards.items():
        ram = host_ram_of.get(key)
        found = {c.profile: c for c in card_profiles(card, searches, runs, ram)}
        cards.append(CardRow(
            key, card.name, _source(card.memory_total_mib, card, "memory_total_source"),
            _source(card.overhead_mib, card, "overhead_source"),
            _source(card.other_processes_mib, card, "other_processes_source"),
            card.usable_pool_mib,
            host_ram_words(list(found.values()), None if ram is None else f"{ram / 1024:g}"),
            [card_cell(found[p]) for p in order]))
    ordered = {p: searches[p] for p in order}
    agreements = machine_agreement(ordered)
    b_inferred = any(b.fails_at_inferred for s in ordered.values() for b in s.search.bands)
    deltas = knob_deltas(ordered, {p: hosts.diffusers_profiles[p].base for p in order})
    contradicting = [line for p in order for line in reference_contradictions(searches[p])]
    checks = sweep_checks(runs, searches)
    readings = {r: sum(c.reading == r for c in checks)
                for r in ("agrees", "uncertain", "contradicts")}
    first = next(iter(searches.values())).search
    unsearched = never_searched(loaded.evidence, configs, list(dict.fromkeys(
        p for host in sorted({s.host for found in searches.values()
                              for s in (found, *found.elsewhere)})
        for p in hosts.host(host).diffusers_profiles)))
    svg = render_pool_svg(
        # A B not tried at its count (the previous count's) is no band to draw: the table's
        # parentheses say it; the figure shades only what was measured there.
        [PoolLine(p, tuple((b.reference_count, None if b.fails_at_inferred else b.fails_at_mib,
                            b.fits_at_mib)
                           for b in searches[p].search.bands if b.stopped is None), tuple(cells[p]))
         for p in order],
        [CardLine(c.name, c.usable_pool_mib, bool(c.assumed)) for c in hosts.cards.values()],
        counts,
        title=f"{model} in Diffusers, random weights: the smallest torch pool (A, and "
              "B to A uncertain)", b_inferred=b_inferred)
    return CapacitySearchView(
        sorted({s.attempt for s in searches.values()}),
        searched_on(gpu_of, searches),
        grids_text(loaded, ordered),
        first.num_inference_steps, ", ".join(sorted(set(first.sizes.values()))),
        [f"{n} ref{'' if n == 1 else 's'}" for n in counts], order, rows, cards, len(checks),
        readings, [c.text() + f": {c.reading}" for c in checks if c.reading != "agrees"],
        list(dict.fromkeys(contradicting)), len(contradicting),
        [line for p in order for line in noisy_bands(searches[p])],
        [agreement_words(a, gpu_of) for a in agreements], agreement_brief(agreements),
        b_inferred,
        cut_searches(loaded.evidence, configs, set(searches)),
        unsearched, [p for p in unsearched if p in {r.profile for r in runs}],
        pinned_weight_words(ordered),
        knob_rows(deltas, ordered, counts, gpu_of), spill_line(deltas, ordered, gpu_of),
        figure.as_posix(), svg)


def pinned_weight_words(searches: dict[str, Searched]) -> list[str]:
    """Each build's page-locked bytes against its weights' own, profiles that pinned alike
    together: "`a` and `b`: 39.1 GiB for 30.2 GiB of weights (×1.30)"."""
    alike: dict[tuple[float, float], list[str]] = {}
    for name, found in searches.items():
        if (figures := pinned_weights_mib(found)) is not None:
            alike.setdefault(figures, []).append(f"`{name}`")
    return [f"{names(profiles)}: {pinned / 1024:.1f} GiB for {weights / 1024:.1f} GiB of "
            f"weights (×{pinned / weights:.2f})"
            for (pinned, weights), profiles in alike.items()]


# Each grid flag by the setting the report names.
GRID_WORDS = {"--floor-mib": "floor", "--ceiling-mib": "ceiling", "--resolution-mib": "step",
              "--repeats": "repeats"}


def grids_text(loaded: Loaded, searches: dict[str, Searched]) -> str:
    """Each grid the searches ran, with who chose its settings; where they ran more than one,
    each names its profiles."""
    by_grid: dict[tuple, dict[str, Searched]] = {}
    for name, found in searches.items():
        g = found.search.search
        by_grid.setdefault((g.floor_mib, g.ceiling_mib, g.resolution_mib, g.repeats), {})[
            name] = found
    return "; ".join(
        f"{floor:,}–{ceiling:,} MiB every {step} MiB, {repeats} repeat(s) at each side"
        + (f" for {', '.join(f'`{p}`' for p in group)}" if len(by_grid) > 1 else "")
        + f" ({grid_provenance(loaded, group)})"
        for (floor, ceiling, step, repeats), group in by_grid.items())


def grid_provenance(loaded: Loaded, searches: dict[str, Searched]) -> str:
    """Which grid settings the searches' recorded command lines gave, and which were omniprobe's
    defaults."""
    commands = [a.meta.provenance.command for a in loaded.evidence.attempts
                if a.id in {s.attempt for s in searches.values()}]
    given = set().union(*(given_grid_flags(c or []) for c in commands))
    named = [GRID_WORDS[f] for f in GRID_FLAGS if f in given]
    default = [GRID_WORDS[f] for f in GRID_FLAGS if f not in given]
    return "; ".join(part for part in (
        f"{', '.join(named)} given on the command line" if named else "",
        f"{', '.join(default)} omniprobe's default{'s' if len(default) > 1 else ''}"
        if default else "") if part)


def searched_on(gpu_of: dict[str, str], searches: dict[str, Searched]) -> str:
    """The GPUs the newest searches ran on, each once, the most used first (`gpu_of`: each
    host's GPU, by host name)."""
    used = Counter(gpu_of[s.host] for s in searches.values())
    return " and the ".join(gpu for gpu, _ in used.most_common())


def agreement_brief(found: list[MachineAgreement]) -> str | None:
    """How far A moved between machines, over every profile searched on two, in a few words."""
    if not found:
        return None
    apart = max((abs(mib) for a in found for mib in a.apart_mib.values()), default=0)
    return (f"A within {apart:,} MiB where a profile ran on two" if apart
            else "A the same where a profile ran on two")


def agreement_words(found: MachineAgreement, gpu_of: dict[str, str]) -> str:
    """One profile's bands on two machines, in words: where A agrees, and where not by how much
    (`gpu_of`: each host's GPU, by host name)."""
    newer, older = (f"the {gpu_of[h]} (`{h}`)" for h in found.hosts)
    same = [n for n in found.counts if n not in found.apart_mib]
    apart = {}
    for n, mib in found.apart_mib.items():
        apart.setdefault(mib, []).append(str(n))
    parts = ([f"A the same at {', '.join(map(str, same))} reference(s)"] if same else []) + [
        f"{mib:+,} MiB at {' and '.join(counts)}" for mib, counts in apart.items()]
    return f"`{found.profile}`, {newer} against {older}: " + "; ".join(parts)
