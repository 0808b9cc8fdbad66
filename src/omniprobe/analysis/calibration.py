"""The emulation held against the seed's real Diffusers runs (issue 32): for each grid profile,
its outcome on the emulated card at the real run's reference count, read against what the real
run did. The emulation is only as good as its agreement with the real runs it can be held
against; a disagreement of the profile closest to the real run is a finding, with its likely
cause where the evidence shows one.

The rules, as tables in tests/test_calibration.py:
- a count the real run ran: the emulation agrees where the profile fits the card with its host,
  and disagrees where it failed (a GPU OOM, a kill at the host's RAM, a run over the cap);
- a count above a ceiling the seed states: not compared, since the seed does not say it tried;
- a profile that did not run at the count: not run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from omniprobe.analysis.diffusers_capacity import ProfileRun
from omniprobe.config.diffusers import DiffusersProfile
from omniprobe_engine.knobs import host_footprint_knobs

Outcome = Literal["fits", "gpu-oom", "host-killed", "over-cap", "host-over", "failed", "not-run"]
Reading = Literal["agrees", "disagrees", "not compared", "not run"]


@dataclass(frozen=True)
class RealRun:
    """What the seed says a real run did: it ran `references` (a ceiling: no more ran)."""

    references: int
    ceiling: bool
    statement: str
    wall_s: float | None  # on the real card, where the seed gives it


@dataclass(frozen=True)
class Observed:
    """A grid profile on the emulated card at one reference count."""

    outcome: Outcome
    peak_mib: float | None = None
    host_held_mib: float | None = None
    pinned_mib: float | None = None
    wall_s: float | None = None  # the measuring GPU's


def observed(run: ProfileRun | None, refs: int, host_ram_mib: int | None) -> Observed:
    """The outcome of `run` at `refs`: a fit needs the GPU pool and, where the card's host RAM
    is stated, the host footprint (classify/host_ram.py's rule)."""
    if run is None:
        return Observed("not-run")
    ram = run.host_ram
    if run.init_outcome != "ready":
        if ram.killed and not run.killed_by_whole_build:
            return Observed("host-killed", None, ram.peak_mib, ram.pinned_mib)
        return Observed("not-run" if run.killed_by_whole_build else "failed")
    cell = run.cell(refs)
    if cell is None or cell.upstream_failure is not None:
        return Observed("not-run")
    if cell.outcome == "oom":
        kind: Outcome = "gpu-oom"
    elif cell.breached:
        kind = "over-cap"
    elif not cell.fits:
        kind = "failed"
    elif host_ram_mib is not None and not ram.within(host_ram_mib):
        kind = "host-over"
    else:
        kind = "fits"
    return Observed(kind, cell.peak_mib, ram.peak_mib, ram.pinned_mib, cell.wall_s)


def reading(real: RealRun, refs: int, seen: Observed) -> Reading:
    if seen.outcome == "not-run":
        return "not run"
    if refs > real.references:
        return "not compared"
    return "agrees" if seen.outcome == "fits" else "disagrees"


def compared_counts(real: RealRun, target: int) -> list[int]:
    """The real run's count, and for a ceiling the target beside it (shown, not compared)."""
    return [real.references] + ([target] if real.ceiling and target > real.references else [])


def placement(profile: DiffusersProfile) -> tuple:
    """What decides a profile's host footprint: the knobs that affect host memory (its offload,
    pinning, precision and quantisation; omniprobe_engine/knobs.py)."""
    return profile.settings(host_footprint_knobs())


def wall_baseline(walls: dict[str, float | None]) -> str | None:
    """The one profile a table's walls at one count are held against: the fastest that fit
    there, under the table's own conditions; None where none fit."""
    timed = {name: wall for name, wall in walls.items() if wall is not None}
    return min(timed, key=lambda name: (timed[name], name)) if timed else None


def slowdown(wall_s: float | None, reference_wall_s: float | None) -> float | None:
    if wall_s is None or not reference_wall_s:
        return None
    return round(wall_s / reference_wall_s, 2)


@dataclass(frozen=True)
class PinnedElsewhere:
    """A run with the same placement that lived to record its page-locked bytes."""

    host: str
    profile: str
    pinned_mib: float


def pinned_elsewhere(profile: DiffusersProfile, profiles: dict[str, DiffusersProfile],
                     runs: list[ProfileRun]) -> PinnedElsewhere | None:
    """Where a profile was killed before it recorded anything, what a run of the same placement
    (another cap, another host) pinned: the largest such figure."""
    same = [r for r in runs if r.profile in profiles and r.host_ram.pinned_mib is not None
            and placement(profiles[r.profile]) == placement(profile)]
    best = max(same, key=lambda r: r.host_ram.pinned_mib, default=None)
    return None if best is None else PinnedElsewhere(best.host, best.profile,
                                                     best.host_ram.pinned_mib)
