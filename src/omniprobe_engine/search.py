"""The capacity search's rule: for one profile and reference count, the smallest memory pool it
fits in, bisected on a grid of pool limits and confirmed by repeats, as a band.

A band is two limits: it fits at every trial at or above A (`fits_at_mib`), it failed at every
trial at or below B (`fails_at_mib`); between B and A it is uncertain (the allocator's history
moves the boundary from one trial to the next). A is None when nothing up to the ceiling fit
reliably; B is None when nothing down to the floor failed. Both are earned at their count: each
is a trial of that count, confirmed by the repeats; what the neighbouring counts found only says
where to look first.

Standalone like the offline runner that imports it from beside itself: the standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

FIT, OOM, ERROR = "fit", "oom", "error"
# The rule's version, recorded with every search: a change of the rule (how it brackets,
# bisects or confirms) raises it, so a search it would not have run the same way is not resumed.
# 1: a count took the previous count's B as its own, untried; 2: every B is tried at its count.
RULE_VERSION = 2


class SearchError(ValueError):
    """Search bounds that cannot make a grid."""


@dataclass(frozen=True)
class Grid:
    """The pool limits a search may try: floor, floor + resolution, ..., the ceiling."""

    floor_mib: int
    ceiling_mib: int
    resolution_mib: int

    def __post_init__(self):
        span = self.ceiling_mib - self.floor_mib
        if self.floor_mib <= 0:
            raise SearchError(f"floor {self.floor_mib} MiB: expected a pool limit above 0")
        if span <= 0:
            raise SearchError(f"floor {self.floor_mib} MiB is at or above the ceiling "
                              f"{self.ceiling_mib} MiB: expected floor < ceiling")
        if not 0 < self.resolution_mib <= span:
            raise SearchError(f"resolution {self.resolution_mib} MiB: expected above 0 and at "
                              f"most the span, {span} MiB")

    @property
    def last(self) -> int:
        """The ceiling's index."""
        return math.ceil((self.ceiling_mib - self.floor_mib) / self.resolution_mib)

    def limit(self, index: int) -> int:
        return min(self.floor_mib + index * self.resolution_mib, self.ceiling_mib)

    def index_at_or_above(self, limit_mib: int) -> int:
        """The first grid index whose limit is at or above `limit_mib`, within the grid."""
        steps = math.ceil((limit_mib - self.floor_mib) / self.resolution_mib)
        return max(0, min(self.last, steps))

    def index_at_or_below(self, limit_mib: int) -> int | None:
        """The last grid index whose limit is at or below `limit_mib`; None below the floor."""
        if limit_mib < self.floor_mib:
            return None
        return min(self.last, (limit_mib - self.floor_mib) // self.resolution_mib)


@dataclass(frozen=True)
class Trial:
    limit_mib: int
    outcome: str  # fit, oom or error
    phase: str  # bracket, bisect or confirm
    repeat: bool  # a repeat at a limit already tried


@dataclass
class Band:
    fits_at_mib: int | None
    fails_at_mib: int | None
    trials: list[Trial] = field(default_factory=list)
    stopped: str | None = None  # why the search ended without a band (a trial's error)


TrialRunner = Callable[[int, str, bool], str]  # (limit MiB, phase, repeat) -> outcome


class _Search:
    def __init__(self, run: TrialRunner, grid: Grid, repeats: int):
        self.run, self.grid, self.repeats = run, grid, repeats
        self.trials: list[Trial] = []
        self.errored = False

    def fits(self, index: int, phase: str) -> bool:
        limit = self.grid.limit(index)
        repeat = any(t.limit_mib == limit for t in self.trials)
        outcome = self.run(limit, phase, repeat)
        self.trials.append(Trial(limit, outcome, phase, repeat))
        if outcome == ERROR:
            self.errored = True
        return outcome == FIT

    def holds(self, index: int, fit: bool) -> bool:
        """Repeats at `index` (its first trial already run) all agree with `fit`."""
        return all(self.fits(index, "confirm") == fit and not self.errored
                   for _ in range(self.repeats))


def search(run: TrialRunner, grid: Grid, repeats: int, *, fail_hint_mib: int | None = None,
           first_guess_mib: int | None = None) -> Band:
    """Bisect one count's boundary. `first_guess_mib`: where to look first (the previous counts'
    trend), galloping up from it while it fails; `fail_hint_mib`: a limit likely to fail (the
    previous count's B: more references seldom need less), tried first below the first fit.
    Neither stands in for a trial: both sides are tried at this count and confirmed. The grid's
    ends are tried only when the boundary comes to lie there. A trial that errors ends it."""
    s = _Search(run, grid, repeats)
    hint = None if fail_hint_mib is None else grid.index_at_or_below(fail_hint_mib)
    lo, hi = -1, grid.last + 1  # -1, last + 1: not tried
    probe = None if first_guess_mib is None else grid.index_at_or_above(first_guess_mib)
    step = 1 if probe is None else max(1, probe - (hint or 0))
    while hi - lo > 1:
        galloping = probe is not None
        if galloping:
            index = probe
        elif hint is not None and lo < hint < hi:
            index, hint = hint, None
        else:
            index = (lo + hi) // 2
        fit = s.fits(index, "bracket" if galloping else "bisect")
        if s.errored:
            return Band(None, None, s.trials, stopped=ERROR)
        if fit:
            hi, probe = index, None
        else:
            lo = index
            probe = min(grid.last, index + step) if galloping and index < grid.last else None
            step *= 2
    hi = hi if hi <= grid.last else None
    lo = lo if lo >= 0 else None
    # Confirm both sides; a side that does not hold moves outward to the next step whose trials
    # so far agree, and is confirmed there.
    hi = _confirmed(s, hi, fit=True)
    lo = _confirmed(s, lo, fit=False)
    if s.errored:
        return Band(None, None, s.trials, stopped=ERROR)
    return Band(None if hi is None else grid.limit(hi), None if lo is None else grid.limit(lo),
                s.trials)


def _confirmed(s: _Search, index: int | None, *, fit: bool) -> int | None:
    """The index, or the nearest one outward from it, where every trial agrees with `fit`
    after the repeats; None past the grid's end (or once a trial errored)."""
    step = 1 if fit else -1
    while index is not None and not s.errored:
        if s.holds(index, fit):
            return index
        while not s.errored:
            index += step
            if not 0 <= index <= s.grid.last:
                return None
            seen = [t.outcome == FIT for t in s.trials if t.limit_mib == s.grid.limit(index)]
            if seen and all(f == fit for f in seen):
                break  # already agrees: confirm it with its repeats
            if not seen and s.fits(index, "confirm") == fit:
                break
    return None


def requests_saved(grid: Grid, repeats: int, band: Band, fail_hint_mib: int | None,
                   first_guess_mib: int | None) -> int:
    """The trials what was already known saved: against a search from the floor and ceiling
    alone, both run on one boundary without noise (every limit at or above the band's A fits),
    so the figure is the priors' doing, not the noise's."""
    need = band.fits_at_mib

    def oracle(limit: int, phase: str, repeat: bool) -> str:
        return FIT if need is not None and limit >= need else OOM

    alone = len(search(oracle, grid, repeats).trials)
    helped = len(search(oracle, grid, repeats, fail_hint_mib=fail_hint_mib,
                        first_guess_mib=first_guess_mib).trials)
    return alone - helped


def next_guess_mib(previous: list[int], resolution_mib: int) -> int | None:
    """Where the next count's search looks first: the last A plus the last step between As (one
    more reference costs about what the last one did), or four steps of the grid after the first."""
    if not previous:
        return None
    if len(previous) == 1:
        return previous[0] + 4 * resolution_mib
    return previous[-1] + max(resolution_mib, previous[-1] - previous[-2])
