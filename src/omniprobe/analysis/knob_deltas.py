"""What one setting buys, read off the searches: a searched profile whose base (hosts.toml's
`base`) was searched too, and whose recorded settings differ from the base's in exactly one
setting, is that setting turned on the base. Per reference count, the pool it saves is the base's
A less its own, good to within the two bands' widths; where both ran a timed request at the same
count and steps on one host, its cost in time is given as ratios to the base (per step after the
first, the decode, the request), since the seconds are the measuring machine's, never a card's."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import JsonValue

from omniprobe.analysis.capacity_bands import Searched
from omniprobe.config.diffusers import setting_changes


@dataclass(frozen=True)
class PoolSaved:
    reference_count: int
    saved_mib: int  # the base's A less the profile's: below 0, the setting costs pool
    within_mib: int  # the two bands' widths together: how far the true saving may lie from it


@dataclass(frozen=True)
class TimeCost:
    """The profile's timed request against its base's, at the same count and steps on one host."""

    host: str
    reference_count: int
    steps: int
    step_ratio: float | None  # per step after the first (None: a side has one step or failed)
    decode_ratio: float | None
    wall_ratio: float


@dataclass(frozen=True)
class KnobDelta:
    profile: str
    base: str
    base_host: str | None  # where the base's bands came from, when not the profile's host
    knob: str
    value: JsonValue
    pool: tuple[PoolSaved, ...]
    time: TimeCost | None


def one_setting_apart(mine: dict, theirs: dict) -> tuple[str, JsonValue] | None:
    """The one setting `mine` and `theirs` differ in, with `mine`'s value, or None (none, or more
    than one)."""
    changes = setting_changes(theirs, mine)
    if len(changes) != 1:
        return None
    [(knob, (_, value))] = changes.items()
    return knob, value


def pool_saved(base: Searched, mine: Searched) -> tuple[PoolSaved, ...]:
    """Per count both banded with an A and a B: the base's A less this one's."""
    found = []
    for band in mine.search.bands:
        theirs = base.band(band.reference_count)
        widths = (band.width_mib, None if theirs is None else theirs.width_mib)
        if None in widths:  # a width needs both edges: A is there too
            continue
        found.append(PoolSaved(band.reference_count, theirs.fits_at_mib - band.fits_at_mib,
                               sum(widths)))
    return tuple(sorted(found, key=lambda p: p.reference_count))


def _ratio(mine: float | None, theirs: float | None) -> float | None:
    return None if mine is None or not theirs else mine / theirs


def time_cost(base: Searched, mine: Searched) -> TimeCost | None:
    """The two timed requests that fit at the same count and steps on one host: the most steps
    first, then the host of the profile's newest search (its newest code)."""
    mine_fits, base_fits = mine.timed_fits(), base.timed_fits()
    shared = mine_fits.keys() & base_fits.keys()
    if not shared:
        return None
    key = max(shared, key=lambda k: (k[1], k[2], k[0] == mine.host, k[0]))
    a, b = mine_fits[key], base_fits[key]
    return TimeCost(key[0], key[2], key[1], _ratio(a.step_after_first_s, b.step_after_first_s),
                    _ratio(a.decode_s, b.decode_s), a.wall_s / b.wall_s)


def paired_base(newest: Searched, mine: Searched) -> Searched:
    """The base's search a profile's bands are held against: the base's on the profile's own
    host where it has one (a band may move a grid step between machines), else its newest."""
    return newest.on(mine.host) or newest


def knob_deltas(searches: dict[str, Searched], bases: dict[str, str | None]) -> list[KnobDelta]:
    """Each searched profile whose base (hosts.toml's `base`, by profile) was searched too and
    whose recorded settings differ from the base's in one setting: that setting's saving and
    cost, in the profiles' order, against the base's `paired_base`."""
    found = []
    for name, mine in searches.items():
        newest = searches.get(bases.get(name) or "")
        if newest is None:
            continue
        base = paired_base(newest, mine)
        apart = one_setting_apart(mine.search.settings, base.search.settings)
        if apart is not None:
            found.append(KnobDelta(name, base.search.profile,
                                   None if base.host == mine.host else base.host, *apart,
                                   pool_saved(base, mine), time_cost(newest, mine)))
    return found
