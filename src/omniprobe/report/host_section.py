"""One host's section of the report as the templates read it: its evidence, its run-matrix rows,
its timeline figures, and what each part shows (the output and memory parts are mixed in from
outputs_view and memory_view)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omniprobe.analysis.derived import (
    ImageStructure,
    KvDelta,
    PsnrGroup,
    StatedDisagreement,
)
from omniprobe.analysis.estimates import EstimateCheck
from omniprobe.analysis.summaries import (
    OfflineResult,
    ServeRunView,
    manifest_summary,
    offline_results,
)
from omniprobe.analysis.verdicts import (
    HistoryEntry,
    HostVerdict,
)
from omniprobe.config.fixtures import FixtureSuite
from omniprobe.config.host_entry import Host
from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.load import LoadedAttempt
from omniprobe.evidence.models.runs import Cell
from omniprobe.evidence.models.statements import CodeLocation, StatedFigure
from omniprobe.report import verdict_lines as vl
from omniprobe.report.filters import names, refs, span
from omniprobe.report.memory_view import MemoryParts
from omniprobe.report.outputs_view import OutputParts
from omniprobe.report.paths import REPORT_DIR

SEAM_PREFIX = "spill_seam_"  # code-read keys of the places a spill path would go


@dataclass(frozen=True)
class TimelineFigure:
    """One server lifetime's GPU memory series, drawn as an SVG beside the report."""

    path: str
    title: str
    svg: str
    summary: object

    @property
    def href(self) -> str:
        """The figure's address from the folder HARNESS.md lies in."""
        return Path(self.path).relative_to(REPORT_DIR).as_posix()

    @property
    def sampled(self) -> bool:
        return self.summary.state == "sampled"


@dataclass
class ServeRunRow:
    view: ServeRunView
    label: str
    flags: str
    init: str
    cells: dict[int, Cell | None]


@dataclass
class HostSection(OutputParts, MemoryParts):
    """One host's section of the report: its evidence, and what the templates show of it (the
    output and memory parts are mixed in from outputs_view and memory_view)."""

    key: str
    host: Host
    hosts: HostsConfig
    fixtures: FixtureSuite
    verdict: HostVerdict
    attempts: list[LoadedAttempt]
    views: list[ServeRunView]
    ref_columns: list[int]
    rows: list[ServeRunRow]
    kv: list[KvDelta]
    psnr: list[PsnrGroup]
    target_ooms: list[tuple[str, Cell]]
    init_oom: object
    baseline_name: str = "baseline"
    stated_figures: dict[str, StatedFigure] = field(default_factory=dict)
    timelines: list[TimelineFigure] = field(default_factory=list)
    images: list[ImageStructure] = field(default_factory=list)
    disagreements: list[StatedDisagreement] = field(default_factory=list)
    estimates: dict[str, EstimateCheck] = field(default_factory=dict)
    history: list[HistoryEntry] = field(default_factory=list)
    baseline_attempt: LoadedAttempt | None = None
    steps: int = 0  # the fixtures' inference steps

    def collect(self, section: str) -> list:
        return [item for a in self.attempts for item in getattr(a, section)]

    def offline_results(self) -> list[OfflineResult]:
        return offline_results(self.collect("offline"))

    def findings(self, placement: str) -> list:
        return [f for f in self.collect("findings") if f.placement == placement]

    def failed_inits(self, flag_sets) -> list[tuple[str, object]]:
        return [
            (v.flag_set, v.run.init)
            for v in self.views
            if v.flag_set in flag_sets and v.run.init.outcome != "ready"
        ]

    @property
    def has_evidence(self) -> bool:
        return bool(self.attempts)

    # --- the verdict -----------------------------------------------------------------
    @property
    def headline(self) -> str:
        return vl.headline(self)

    @property
    def opening(self) -> list[vl.Line]:
        return vl.opening_lines(self)

    @property
    def summary(self) -> str | None:
        return vl.summary(self)

    @property
    def early_ooms(self) -> list[vl.EarlyOom]:
        return vl.early_ooms(self.rows, self.verdict.target_refs)

    @property
    def blocker_lines(self) -> list[vl.Line]:
        return vl.blocker_lines(self)

    @property
    def verdict_findings(self) -> list[str]:
        return [f.statement for f in self.findings("verdict")]

    @property
    def no_evidence(self) -> bool:
        return self.verdict.verdict == "no-evidence"

    @property
    def not_measured_causes(self) -> str | None:
        v = self.verdict
        return (
            "; ".join(dict.fromkeys(n.cause for n in v.not_measured)) if v.verdict == "not-measured" else None
        )

    @property
    def built_line(self) -> str | None:
        v = self.verdict
        if v.verdict != "built":
            return None
        sp = self.ceiling_speedup
        return (
            f"{refs(v.target_refs)} are served with sound output under "
            f"{names(vl.config_names(v.served_by, v.unreached))}"
            + (f", at {span(sp.speedup, 1)}× the baseline's speed" if sp else "")
            + "."
        )

    @property
    def standin_note(self) -> str | None:
        v = self.verdict
        halves = v.standin_halves
        if not halves:
            return None
        part = ", in part" if "original" in v.capacity_inputs + v.structure_inputs else ""
        plural = len(halves) > 1
        return (
            f"The {' and '.join(halves)} {'halves' if plural else 'half'} of this verdict "
            f"rest{'' if plural else 's'} on stand-in inputs{part} (omniprobe's prompts and references "
            'where the seed\'s are unstated; cells marked "stand-in"); PSNR and speed against the '
            "baseline never do."
        )

    # --- sections --------------------------------------------------------------------
    @property
    def history_rows(self) -> list[tuple[str, HistoryEntry]]:
        """Consecutive attempts whose row would say the same thing share one row."""
        rows: list[tuple[list[str], HistoryEntry]] = []
        for e in self.history:
            key = _history_key(e)
            if rows and _history_key(rows[-1][1]) == key:
                rows[-1][0].append(e.attempt)
            else:
                rows.append(([e.attempt], e))
        return [(", ".join(f"`{a}`" for a in ids), e, _blockers_text(e.verdict)) for ids, e in rows]

    @property
    def seams(self) -> list[CodeLocation]:
        return [loc for loc in self.collect("code_read") if loc.key.startswith(SEAM_PREFIX)]

    @property
    def code_read_items(self) -> list[CodeLocation]:
        """The code read, less what another section states: the seams (follow-through) and the
        places an OOM is shown (the OOM table, the common init failure)."""
        shown = {str(c.oom.location) for _, c in self.target_ooms if c.oom.location}
        if self.init_oom is not None and self.init_oom.location:
            shown.add(str(self.init_oom.location))
        return [
            loc
            for loc in self.collect("code_read")
            if not loc.key.startswith(SEAM_PREFIX) and not (loc.ref and str(loc.ref) in shown)
        ]

    @property
    def run_notes(self) -> list[str]:
        """What the matrix needs said once: a model served by hand, a knob that never reached
        the model, a deploy config upstream said it ignored."""
        v = self.verdict
        notes = [
            f"Attempt {u.attempt} served `{u.model}`, given by hand with `--model`: not the pinned "
            "snapshot, so its rows may be of another model revision."
            for u in v.unpinned
        ]
        notes += [
            f'{u.flag_set} ran as {u.base}: its `{u.knob}` never reached the model (see "Propagation '
            f'gap"); the report writes the two as {u.base}/{u.flag_set}.'
            for u in v.unreached
        ]
        notes += [
            f"{w.flag_set} ({w.attempt.id}): the server's log carries upstream's warning that it ignored "
            'the deploy config ("No registered PipelineConfig resolved for model …"), so the run '
            "measures its configuration without it."
            for w in self.views
            if any(lt.deploy_config_ignored for lt in w.run.lifetimes)
        ]
        return notes

    @property
    def environment(self) -> dict | None:
        filed = [a for a in self.attempts if a.environment is not None]
        if not filed:
            return None
        latest = max(filed, key=lambda a: (a.meta.date, a.id))
        return {"attempt": latest.id, **manifest_summary(latest.environment)}


def _blockers_text(v: HostVerdict) -> str:
    if v.verdict != "not-built":
        return "—"
    return "; ".join(f"{b.kind} ({', '.join(b.flag_sets)})" for b in v.blockers) or "—"


def _history_key(e: HistoryEntry) -> tuple:
    v = e.verdict
    return (
        e.date,
        e.provenance,
        e.upstream_commit,
        e.torch,
        e.model_snapshot,
        v.verdict,
        tuple((b.kind, b.flag_sets) for b in v.blockers),
    )
