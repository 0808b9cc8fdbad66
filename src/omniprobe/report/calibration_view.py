"""The calibration table (issue 32): each real Diffusers run of the seed beside the emulation of
its card under a grid of profiles; every figure from evidence, hosts.toml and the fixtures, every
reading from analysis/calibration.py."""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe.analysis.calibration import (
    Observed,
    RealRun,
    compared_counts,
    observed,
    pinned_elsewhere,
    reading,
    slowdown,
    wall_baseline,
)
from omniprobe.analysis.diffusers_capacity import ProfileRun
from omniprobe.config.calibration import Calibration
from omniprobe.config.diffusers import DiffusersProfile
from omniprobe.evidence.validate import Loaded


def card_host_ram_mib(card, emulation) -> int | None:
    """The card's host's RAM (MiB): the real host's stated figure, else the emulation's."""
    gib = (card.host_ram_gib if card is not None and card.host_ram_gib is not None
           else emulation.host_ram_gib if emulation is not None else None)
    return None if gib is None else round(gib * 1024)


@dataclass(frozen=True)
class CalibrationCell:
    outcome: str
    reading: str
    wall: str  # the H200's seconds a request, and against leaf offload with streams


@dataclass(frozen=True)
class CalibrationRow:
    profile: str
    level: str
    streams: str
    text_encoder: str
    closest: bool
    cells: list[CalibrationCell]


@dataclass(frozen=True)
class CalibrationView:
    name: str
    description: str
    card: str
    host: str  # the emulated host's name
    host_key: str
    conditions: str  # the cap and host RAM it ran under
    real: str  # what the real run did, in the seed's words and figures
    counts: list[int]
    rows: list[CalibrationRow]
    unknown: list[str]
    finding: str | None  # the closest profile's disagreement, with its likely cause
    agree: list[str]  # the profiles that agree at the real run's count
    disagree: list[str]
    closest_reading: str = ""  # the closest profile at the real run's count, in words
    real_references: int = 0  # the count the real run ran: the counts above it are shown only

    @property
    def compared(self) -> list[int]:
        """The columns the report shows: the counts compared with the real run (DETAILS.md
        shows the rest)."""
        return [i for i, n in enumerate(self.counts) if n <= self.real_references]

    @property
    def not_run(self) -> list[str]:
        """The grid's profiles not run under these conditions: named, not tabulated."""
        return [r.profile for r in self.rows
                if all(c.outcome == "not run" for c in r.cells) and not r.closest]

    @property
    def agreement(self) -> str:
        """The opening's line where the closest profile does not disagree."""
        return f"{self.closest_reading}, against {self.description}"


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f}"


def outcome_text(seen: Observed, host_ram_mib: int | None) -> str:
    held = f", host {_gib(seen.host_held_mib)} GiB" if seen.host_held_mib is not None else ""
    pinned = f" ({_gib(seen.pinned_mib)} pinned)" if seen.pinned_mib else ""
    return {
        "fits": f"fits: GPU {seen.peak_mib or 0:,.0f} MiB{held}{pinned}",
        "gpu-oom": f"GPU OOM at {seen.peak_mib or 0:,.0f} MiB",
        "host-killed": "killed at the host RAM cap, building",
        "over-cap": f"{seen.peak_mib or 0:,.0f} MiB, process tree over the GPU cap",
        "host-over": f"fits the GPU, not the host's {_gib(host_ram_mib or 0)} GiB{held}{pinned}",
        "failed": "failed (not for memory)",
        "not-run": "not run",
    }[seen.outcome]


def _level(p: DiffusersProfile) -> str:
    return p.offload.removeprefix("group-")


def _streams(p: DiffusersProfile) -> str:
    if not p.use_stream:
        return "off"
    return "on" + (", low_cpu_mem_usage" if p.low_cpu_mem_usage else "")


def real_run(loaded: Loaded, cal: Calibration, card_key: str) -> RealRun | None:
    """The real run's outcome, read from the card's evidence; None where it is not on record."""
    evidence = loaded.evidence
    if cal.figure is not None:
        fig = next((f for a in evidence.for_host(card_key) for f in a.figures
                    if f.key == cal.figure and f.value is not None), None)
        return None if fig is None else RealRun(int(fig.value), cal.ceiling, fig.statement, None)
    attempt = next((a for a in evidence.attempts if a.id == cal.baseline_attempt), None)
    if attempt is None or attempt.baseline is None or not attempt.baseline.walls:
        return None
    walls = [(loaded.fixtures.get(w.fixture).reference_count, w) for w in attempt.baseline.walls
             if any(f.id == w.fixture for f in loaded.fixtures.fixtures)]
    if not walls:
        return None
    refs, wall = max(walls, key=lambda item: item[0])
    base = attempt.baseline
    return RealRun(refs, False, f"{cal.baseline_attempt} (profile {base.profile}) ran "
                                f"{wall.fixture} ({refs} references)", wall.wall_s)


def _wall_text(run_wall: float | None, base_wall: float | None, base: str | None,
               own: bool) -> str:
    if run_wall is None:
        return "—"
    text = f"{run_wall:.1f} s"
    if own:
        return text + " (baseline)"
    factor = slowdown(run_wall, base_wall)
    return text if factor is None else text + f", {factor:.1f}× `{base}`"


def calibration_views(loaded: Loaded, runs_by_host: dict[str, list[ProfileRun]],
                      target: int) -> list[CalibrationView]:
    hosts = loaded.hosts
    every_run = [r for runs in runs_by_host.values() for r in runs]
    out = []
    for name, cal in hosts.calibrations.items():
        host = hosts.host(cal.emulated_host)
        emulation = host.emulation
        card_key = emulation.emulates
        card = hosts.host(card_key)
        ram_mib = card_host_ram_mib(card, emulation)
        ram_cap = round(emulation.host_ram_gib * 1024) if emulation.host_ram_gib else None
        cap = hosts.emulated_cap_mib(cal.emulated_host)
        real = real_run(loaded, cal, card_key)
        if real is None:
            continue
        runs = [r for r in runs_by_host.get(cal.emulated_host, []) if r.cap_mib == cap]
        chosen = {r.profile: r for r in runs if r.host_ram.cap_mib == ram_cap}
        profiles = {p: hosts.diffusers_profiles[p] for p in dict.fromkeys([cal.closest, *cal.grid])}
        counts = compared_counts(real, target)
        rows, agree, disagree, closest_seen, closest_reading = [], [], [], None, ""
        seen_at = {(p, n): observed(chosen.get(p), n, ram_mib) for p in profiles for n in counts}
        walls = {n: {p: seen_at[p, n].wall_s if seen_at[p, n].outcome == "fits" else None
                     for p in profiles} for n in counts}
        baseline = {n: wall_baseline(walls[n]) for n in counts}
        for profile_name, profile in profiles.items():
            cells = []
            for refs in counts:
                seen = seen_at[profile_name, refs]
                read = reading(real, refs, seen)
                base = baseline[refs]
                cells.append(CalibrationCell(outcome_text(seen, ram_mib), read, _wall_text(
                    walls[refs][profile_name], walls[refs].get(base), base,
                    base == profile_name)))
                if refs == real.references:
                    (agree if read == "agrees" else disagree if read == "disagrees"
                     else []).append(profile_name)
                    if profile_name == cal.closest:
                        closest_reading = (f"{read} under its closest profile `{cal.closest}` "
                                           f"({outcome_text(seen, ram_mib)})")
                    if profile_name == cal.closest and read == "disagrees":
                        closest_seen = (seen, profile)
            rows.append(CalibrationRow(profile_name, _level(profile), _streams(profile),
                                       "int8" if profile.quantize_text_encoder else "bf16",
                                       profile_name == cal.closest, cells))
        finding = None if closest_seen is None else _finding(
            cal, real, *closest_seen, every_run, ram_mib, hosts.diffusers_profiles)
        conditions = f"capped at {cap / 1024:g} GiB" + (
            f", host RAM capped at {emulation.host_ram_gib:g} GiB" if ram_cap else
            ", host RAM not capped")
        out.append(CalibrationView(
            name, cal.description, card.name, host.name, cal.emulated_host, conditions,
            real.statement + (f", {real.wall_s:g} s a request on the real card"
                              if real.wall_s else ""), counts, rows, cal.unknown, finding,
            agree, disagree, closest_reading, real.references))
    return out


def _finding(cal: Calibration, real: RealRun, seen: Observed, profile: DiffusersProfile,
             runs: list[ProfileRun], ram_mib: int | None, profiles: dict) -> str:
    """The closest profile's disagreement, first in its card's opening, with its likely cause
    where the evidence shows one (the grid's own readings are the table's)."""
    lead = (f"**The emulation disagrees with the seed's real run** ({cal.description}) under its "
            f"closest profile `{cal.closest}`: {outcome_text(seen, ram_mib)}, where the real run "
            f"ran {real.references} reference(s).")
    if seen.outcome == "host-killed" and profile.use_stream and not profile.low_cpu_mem_usage:
        pinned = pinned_elsewhere(profile, profiles, runs)
        if pinned is not None and ram_mib is not None and pinned.pinned_mib > ram_mib:
            return (f"{lead} Likely cause: with streams every offloaded tensor keeps a "
                    f"page-locked copy, {pinned.pinned_mib:,.0f} MiB under `{pinned.profile}` "
                    f"(the same placement, on {pinned.host}), more than the host's "
                    f"{ram_mib / 1024:g} GiB, which no swap or zram can take; the seed does not "
                    "state the real run's streams.")
        return (f"{lead} Likely cause: its streams' page-locked copies of the offloaded weights; "
                "the seed does not state the real run's streams.")
    return f"{lead} The evidence shows no cause."
