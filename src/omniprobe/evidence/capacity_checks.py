"""A capacity attempt held against itself (issue 53): its searches, bands and trials must tell one
story, or `validate` names the file, the record and the rule. What each band may claim is its
own (CapacityBand.disagreements); what spans records is here."""

from __future__ import annotations

from collections.abc import Iterator

from omniprobe.evidence.models.capacity import (
    GRID_FLAGS,
    CapacityTrial,
    ProfileSearch,
    SearchSettings,
    grid_chooser,
)

# (file, JSON path in its content, what is wrong)
Finding = tuple[str, str, str]


def capacity_findings(searches: list[ProfileSearch], trials: list[CapacityTrial],
                      fixture_counts: dict[str, int], command: list[str] | None = None
                      ) -> Iterator[Finding]:
    """Every way the attempt's capacity.json and capacity-trials.json disagree with each other,
    with the fixtures (`fixture_counts`: each fixture's reference count) or with the command line
    that made the attempt (`command`, its provenance's; None: not recorded)."""
    by_profile: dict[str, ProfileSearch] = {}
    for i, search in enumerate(searches):
        where = f"$[{i}]"
        yield from (("capacity.json", f"{where}.search", why)
                    for why in grid_findings(search.search, searches[0].search, i, command))
        if search.profile in by_profile:
            yield ("capacity.json", f"{where}.profile", f"a second search of profile "
                   f"{search.profile!r}: an attempt holds one search per profile")
        by_profile.setdefault(search.profile, search)
        if search.init_outcome != "ready" and search.bands:
            yield ("capacity.json", f"{where}.bands", f"bands under a search whose build ended "
                   f"{search.init_outcome}: a search that built nothing found no band")
        for j, band in enumerate(search.bands):
            counted = [t for t in trials if t.counts and t.profile == search.profile
                       and t.reference_count == band.reference_count]
            yield from (("capacity.json", f"{where}.bands[{j}]", why)
                        for why in band.disagreements(counted))
            known = fixture_counts.get(band.fixture)
            if known is not None and known != band.reference_count:
                yield ("capacity.json", f"{where}.bands[{j}].fixture", f"fixture "
                       f"{band.fixture!r} has {known} reference(s), the band "
                       f"{band.reference_count}")
    seen: set[tuple] = set()
    for i, trial in enumerate(trials):
        where = f"$[{i}]"
        search = by_profile.get(trial.profile)
        if search is None:
            yield ("capacity-trials.json", f"{where}.profile", f"a trial of profile "
                   f"{trial.profile!r}, which no search in capacity.json holds")
        elif not on_grid(trial.limit_mib, search):
            grid = search.search
            yield ("capacity-trials.json", f"{where}.limit_mib", f"{trial.limit_mib} MiB is not "
                   f"on the search's grid ({grid.floor_mib}-{grid.ceiling_mib} MiB every "
                   f"{grid.resolution_mib})")
        known = fixture_counts.get(trial.fixture)
        if known is not None and known != trial.reference_count:
            yield ("capacity-trials.json", f"{where}.fixture", f"fixture {trial.fixture!r} has "
                   f"{known} reference(s), the trial {trial.reference_count}")
        most = peak_bound_mib(trial)
        if trial.peak_mib is not None and trial.peak_mib > most:
            yield ("capacity-trials.json", f"{where}.peak_mib", f"a reserved peak of "
                   f"{trial.peak_mib:,} MiB in a pool limited to {trial.limit_mib:,}: at most "
                   f"{most:,}, the limit and what lies outside the pool")
        key = (trial.profile, trial.reference_count, trial.limit_mib, trial.phase,
               trial.repeat, trial.lifetime, trial.started_s, trial.wall_s)
        if key in seen:
            yield ("capacity-trials.json", where, "the same trial twice: each trial once")
        seen.add(key)


def grid_findings(grid: SearchSettings, first: SearchSettings, i: int,
                  command: list[str] | None) -> list[str]:
    """An attempt runs one grid (a resume under another is refused), and says who chose it as
    the command line that made the attempt does: a grid flag named there, the command line."""
    found = []
    if i > 0 and (changed := first.differences(grid)):
        found.append(f"a second grid in one attempt ({'; '.join(changed)} from $[0]'s): an "
                     "attempt's searches share one grid")
    if command is not None and grid.chosen_by != (said := grid_chooser(command)):
        names = "names a grid flag" if said == "command line" else "names no grid flag"
        found.append(f"chosen_by {grid.chosen_by!r}, while the attempt's command line "
                     f"({' '.join(command)}) {names} ({', '.join(GRID_FLAGS)}): expected "
                     f"{said!r}")
    return found


# Where a trial records nothing of what lies outside torch's pool: the most the allocator's own
# rounding and the CUDA context may add to the limit (chosen by omniprobe; a committed H200
# trial's reserved peak went 8 MiB over its limit, with 758 MiB outside the pool).
OUTSIDE_UNRECORDED_MIB = 1024


def peak_bound_mib(trial: CapacityTrial) -> float:
    """The most a trial's reserved peak can be: its limit, plus what it says lay outside the pool
    (OUTSIDE_UNRECORDED_MIB where it says nothing)."""
    outside = trial.outside_pool_mib
    return trial.limit_mib + (OUTSIDE_UNRECORDED_MIB if outside is None else outside)


def on_grid(limit_mib: int, search: ProfileSearch) -> bool:
    """A limit the search's grid holds: the floor, a whole number of steps above it, or the
    ceiling."""
    grid = search.search
    return (grid.floor_mib <= limit_mib <= grid.ceiling_mib
            and ((limit_mib - grid.floor_mib) % grid.resolution_mib == 0
                 or limit_mib == grid.ceiling_mib))
