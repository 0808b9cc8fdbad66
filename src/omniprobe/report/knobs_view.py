"""The report's table of what each setting buys (analysis/knob_deltas.py): per profile one setting
away from its searched base, the pool saved at each count and the time it costs, as ratios."""

from __future__ import annotations

import json
from dataclasses import dataclass

from omniprobe.analysis.capacity_bands import Searched
from omniprobe.analysis.card_answers import (
    first_request_pinned_mib,
    host_memory_words,
    search_host_figures,
)
from omniprobe.analysis.knob_deltas import KnobDelta, TimeCost, paired_base
from omniprobe_engine.kv_host import is_pinned


@dataclass(frozen=True)
class KnobRow:
    setting: str  # `knob` = value
    profile: str
    base: str
    base_where: str  # "" where the base's bands are from the profile's host, else ", on the GPU"
    saved: list[str]  # by reference count: MiB saved, ± both bands' widths
    time: str
    host: str  # the host memory its search held against the base's, "—" where either lacks it
    starts: str  # whether both searches' trials recorded what they started with


def saved_cell(saved_mib: int, within_mib: int) -> str:
    return f"{saved_mib:,} ± {within_mib:,}"


def ratio_words(cost: TimeCost | None, gpu: str | None = None) -> str:
    """The ratios, with the count, the steps and the GPU (`gpu`) they were timed at."""
    if cost is None:
        return "not timed on one machine for both"
    parts = [f"{what} ×{ratio:.2f}" for what, ratio in (
        ("a step after the first", cost.step_ratio), ("the decode", cost.decode_ratio),
        ("the request", cost.wall_ratio)) if ratio is not None]
    return (", ".join(parts) + f" ({cost.reference_count} ref"
            f"{'' if cost.reference_count == 1 else 's'}, {cost.steps} steps"
            + (f", {gpu})" if gpu else ")"))


def starts_words(searches: dict[str, Searched], delta: KnobDelta) -> str:
    """Whether both bands rest on trials that recorded their start (a clean start shown), else
    which side's did not: a saving across the two is then partly the harness's."""
    unshown = [f"`{p}`" for p in (delta.profile, delta.base)
               if searches[p].start_figures() != "recorded"]
    return "both recorded" if not unshown else "not recorded: " + ", ".join(unshown)


def host_more_mib(delta: KnobDelta, searches: dict[str, Searched]) -> tuple[float, float] | None:
    """The most the profile's search held in host memory, and of it page-locked, less its paired
    base's (MiB); None where either build recorded no page-locked figure."""
    mine = searches[delta.profile]
    figures = search_host_figures(mine), search_host_figures(paired_base(searches[delta.base],
                                                                         mine))
    if None in figures:
        return None
    (peak, pinned), (base_peak, base_pinned) = figures
    return peak - base_peak, pinned - base_pinned


def signed_gib(mib: float) -> str:
    """+27.9, -0.3, and 0.0 where it rounds to nothing (never "-0.0")."""
    gib = round(mib / 1024, 1)
    return f"{gib:+.1f}" if gib else "0.0"


def host_more_words(more: tuple[float, float] | None) -> str:
    if more is None:
        return "—"
    return f"{signed_gib(more[0])} GiB ({signed_gib(more[1])} page-locked)"


def setting_words(delta: KnobDelta) -> str:
    return f"`{delta.knob}` = {json.dumps(delta.value)}"


def knob_row(delta: KnobDelta, counts: list[int], searches: dict[str, Searched],
             gpu_of: dict[str, str]) -> KnobRow:
    by_count = {p.reference_count: p for p in delta.pool}
    where = "" if delta.base_host is None else f", on the {gpu_of.get(delta.base_host)}"
    return KnobRow(setting_words(delta), delta.profile, delta.base, where,
                   [saved_cell(by_count[n].saved_mib, by_count[n].within_mib)
                    if n in by_count else "—" for n in counts],
                   ratio_words(delta.time, delta.time and gpu_of.get(delta.time.host)),
                   host_more_words(host_more_mib(delta, searches)),
                   starts_words(searches, delta))


def knob_rows(deltas: list[KnobDelta], searches: dict[str, Searched], counts: list[int],
              gpu_of: dict[str, str]) -> list[KnobRow]:
    """`gpu_of`: each host's GPU, by host name."""
    return [knob_row(d, counts, searches, gpu_of) for d in deltas]


@dataclass(frozen=True)
class SpillLine:
    """The seed's missing spill path, as Diffusers measured it: the conditioning KV in pinned
    host memory against the cache on the GPU, at the largest count both banded."""

    where: str  # the placement in words: "pinned host memory"
    references: int
    pool_mib: int  # A with the cache in host memory
    base_pool_mib: int  # A with it on the GPU
    saved_mib: int
    step_ratio: float | None  # per denoising step after the first, against the base
    steps: int | None  # the timed requests' steps
    gpu: str | None  # the GPU they were timed on
    pinned_more_gib: float | None  # page-locked host memory beyond the base's, the search's most
    fresh_pinned_more_gib: float | None  # the same where that count came first in its runner,
    # where that differs
    most: list[str]  # the settings that save the most at that count, each `knob` = value
    most_at_zero: list[str]  # and at no reference
    most_at_zero_mib: int | None


def _most(deltas: list[KnobDelta], count: int) -> tuple[list[str], int | None]:
    saved = {setting_words(d): p.saved_mib
             for d in deltas for p in d.pool if p.reference_count == count}
    if not saved:
        return [], None
    best = max(saved.values())
    return [k for k, v in saved.items() if v == best], best


def spill_line(deltas: list[KnobDelta], searches: dict[str, Searched],
               gpu_of: dict[str, str]) -> SpillLine | None:
    """None where no profile with the cache in pinned host memory was searched beside its base
    (`deltas`: knob_deltas of `searches`; `gpu_of`: each host's GPU). Of several pinned
    placements, the one that pins the least more than its base (packed or not), then by name."""
    def pinned_more_gib(delta: KnobDelta) -> float | None:
        more = host_more_mib(delta, searches)
        return None if more is None else more[1] / 1024

    pinned = {d: pinned_more_gib(d) for d in deltas if d.knob == "kv_placement" and d.pool
              and is_pinned(d.value)}
    if not pinned:
        return None
    spill = min(pinned, key=lambda d: (pinned[d] is None, pinned[d] or 0.0, d.value))
    saved = spill.pool[-1]
    mine = searches[spill.profile]
    base = paired_base(searches[spill.base], mine)
    fresh = first_request_pinned_mib(mine, saved.reference_count)
    base_figures = search_host_figures(base)
    most, _ = _most(deltas, saved.reference_count)
    zero, zero_mib = _most(deltas, 0)
    time = spill.time
    more = pinned[spill]
    fresh_more = (None if None in (fresh, base_figures)
                  else (fresh - base_figures[1]) / 1024)
    return SpillLine(
        host_memory_words(spill.value), saved.reference_count,
        mine.band(saved.reference_count).fits_at_mib,
        base.band(saved.reference_count).fits_at_mib, saved.saved_mib,
        time.step_ratio if time else None, time.steps if time else None,
        gpu_of.get(time.host) if time else None,
        more, None if fresh_more == more else fresh_more, most, zero, zero_mib)
