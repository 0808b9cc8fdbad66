"""View models of an emulated host beside the host it emulates: its curve figure and its guard."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from omniprobe.analysis.capacity_curve import CapacityCurve, capacity_curve
from omniprobe.analysis.emulation_compare import (
    CellPair,
    InitPair,
    TransferCaveat,
    compare_cells,
    compare_inits,
    transfer_caveat,
)
from omniprobe.analysis.summaries import ServeRunView, run_views
from omniprobe.analysis.verdicts import HostVerdict
from omniprobe.config.host_entry import Host
from omniprobe.evidence.load import LoadedAttempt
from omniprobe.evidence.models.runs import EmulationCheck
from omniprobe.evidence.quantities import Range
from omniprobe.evidence.validate import Loaded
from omniprobe.report import verdict_lines as vl
from omniprobe.report.capacity_svg import need_rows, render_curve_svg
from omniprobe.report.filters import num, span
from omniprobe.report.paths import CAPACITY_DIR, REPORT_DIR

if TYPE_CHECKING:
    from omniprobe.report.host_section import HostSection


@dataclass
class CurveFigure:
    path: str
    svg: str
    caps_gib: list[str]
    rows: list[tuple[str, list[str]]]  # flag set, what each reference count needs (GiB)

    @property
    def href(self) -> str:
        return Path(self.path).relative_to(REPORT_DIR).as_posix()


def curve_figure(curve: CapacityCurve, host: Host) -> CurveFigure:
    """The figure and its table's rows, whose cells are the figure's own row labels (need_rows)."""
    svg = render_curve_svg(curve, title=f"{host.name}: minimum VRAM (GiB) per reference count")
    return CurveFigure((CAPACITY_DIR / f"{curve.host}.svg").as_posix(), svg,
                       [f"{c / 1024:g}" for c in curve.caps_mib], need_rows(curve))


@dataclass(frozen=True)
class GuardRow:
    """One emulated server lifetime as its guard saw it, beside what the server itself reported
    for its requests and what the device held that the server's processes did not."""

    attempt: str
    flag_set: str
    check: EmulationCheck
    request_peak_mb: float | None = None
    device_gap_mib: float | None = None
    device_before_mib: float | None = None

    @property
    def requests(self) -> str:
        return "—" if self.request_peak_mb is None else num(self.request_peak_mb)

    @property
    def missed_requests(self) -> bool:
        """The tree never rose to what the server reported for a request: the guard did not watch."""
        return (
            self.request_peak_mb is not None
            and self.check.peak_mib is not None
            and self.check.peak_mib < self.request_peak_mb
        )

    @property
    def capped(self) -> str:
        return (
            "; ".join(f"pid {c.pid}: {num(c.context_mib)} / {num(c.allowed_mib)}" for c in self.check.capped)
            or "none"
        )

    @property
    def samples(self) -> str:
        extra = self.check.unchecked_samples
        return f"{self.check.checked_samples}" + (f" ({extra} unchecked)" if extra else "")

    @property
    def breach(self) -> str:
        b = self.check.breach
        return f"**{num(b.held_mib)} MiB at {num(b.t_s)} s**" if b else "none"


@dataclass
class EmulationSection:
    """An emulated host beside the host it emulates."""

    section: HostSection
    target: HostSection | None
    cap_mib: int
    caveat: TransferCaveat
    inits: list[InitPair]
    pairs: list[CellPair]
    curve: CapacityCurve | None
    figure: CurveFigure | None
    guards: list[GuardRow]

    @property
    def ceiling(self) -> str:
        return _ceiling_text(self.section.verdict)

    @property
    def target_ceiling(self) -> str | None:
        return _ceiling_text(self.target.verdict) if self.target else None

    @property
    def init_rows(self) -> list[tuple[str, str, str, str]]:
        return [
            (
                p.flag_set,
                vl.init_text(p.emulated),
                vl.init_text(p.real),
                "agree" if p.agrees else "**disagree**",
            )
            for p in self.inits
        ]

    @property
    def pair_rows(self) -> list[tuple]:
        return [
            (
                p,
                "agree" if p.capacity_agrees else "**disagree**",
                ("—" if p.structure_agrees is None else ("agree" if p.structure_agrees else "**disagree**"))
                + (" (kernel differs: does not transfer)" if p.kernel_caveat else ""),
            )
            for p in self.pairs
        ]

    @property
    def no_pairs(self) -> bool:
        return self.target is not None and not self.pairs

    @property
    def guard_missed(self) -> list[str]:
        return [f"{g.flag_set} ({g.attempt})" for g in self.guards if g.missed_requests]

    @property
    def device_gap(self) -> str | None:
        """Why the device reads more than the server's process tree, where it does."""
        gaps = [g for g in self.guards if g.device_gap_mib and g.device_gap_mib >= 1]
        if not gaps:
            return None
        gap = Range.of(round(g.device_gap_mib) for g in gaps)
        before = [round(g.device_before_mib) for g in gaps if g.device_before_mib]
        text = (
            f"At its peak the device reads {span(gap)} MiB more than the server's process tree on "
            f"{len(gaps)} of {len(self.guards)} server lifetimes"
        )
        if before:
            text += (
                f"; {span(Range.of(before))} MiB were in use on the device before the server started "
                "(the first samples, with no server process yet), so the gap is memory the server "
                "never held, and the guard, which counts the server's tree, rightly leaves it out"
            )
        return text + "."


def _ceiling_text(v: HostVerdict) -> str:
    return f"**{v.verdict}**; served reference ceiling {v.highest_served_refs}" + (
        f" ({', '.join(v.served_by)})" if v.served_by else ""
    )


def emulation_section(
    section: HostSection, by_key: dict[str, HostSection], loaded: Loaded
) -> EmulationSection:
    hosts, key = loaded.hosts, section.key
    curve = capacity_curve(key, hosts, loaded.fixtures, loaded.evidence)
    target = section.host.emulation.emulates
    return EmulationSection(
        section=section,
        target=by_key.get(target) if target else None,
        cap_mib=hosts.emulated_cap_mib(key),
        caveat=transfer_caveat(hosts, key),
        inits=compare_inits(hosts, key, loaded.evidence),
        pairs=compare_cells(hosts, key, loaded.fixtures, loaded.evidence),
        curve=curve,
        figure=curve_figure(curve, section.host) if curve else None,
        guards=[
            guard_row(a, v, index, life)
            for a in loaded.evidence.for_host(
                key, include_simulated=section.host.simulated, include_emulated=True
            )
            for v in run_views(a)
            for index, life in enumerate(v.run.lifetimes)
            if life.timeline and life.timeline.emulation
        ],
    )


def guard_row(attempt: LoadedAttempt, view: ServeRunView, index: int, life) -> GuardRow:
    t = life.timeline
    peaks = [
        r.server_peak_mb
        for r in attempt.requests
        if r.flag_set == view.flag_set and r.lifetime == index and r.server_peak_mb is not None
    ]
    before = [p.device_mib for p in t.points if p.process_mib is None]
    gap = (
        t.device_peak_mib - t.peak_mib
        if t.device_peak_mib is not None and t.peak_mib is not None and t.peak_source == "process"
        else None
    )
    return GuardRow(
        attempt.id,
        view.flag_set,
        t.emulation,
        max(peaks, default=None),
        gap,
        before[0] if before and gap else None,
    )
