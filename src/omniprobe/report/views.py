"""The report's view models: every decision the report makes, prepared for the templates.

Templates loop over the items here and test whether one is present; which flag sets block, which
OOMs came early, which code-read facts are seams, what an estimate's judgement is and how the
run-matrix rows are labelled are all decided here, from the evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from omniprobe.analysis.derived import (
    ImageStructure,
    KvDelta,
    PsnrGroup,
    StatedDisagreement,
    common_init_oom,
    image_structures,
    kv_deltas,
    psnr_groups,
    stated_disagreements,
    target_ooms,
)
from omniprobe.analysis.estimates import EstimateCheck, estimate_checks
from omniprobe.analysis.summaries import ServeRunView, manifest_summary, run_views
from omniprobe.analysis.verdicts import (
    HistoryEntry,
    HostVerdict,
    all_verdicts,
    verdict_attempts,
    verdict_history,
)
from omniprobe.config.fixtures import FixtureSuite
from omniprobe.config.host_entry import Host
from omniprobe.config.hosts import HostsConfig
from omniprobe.config.report_settings import ReportSettings
from omniprobe.evidence.load import LoadedAttempt
from omniprobe.evidence.models.runs import Cell
from omniprobe.evidence.models.statements import CodeLocation, StatedFigure
from omniprobe.evidence.validate import Loaded
from omniprobe.report import verdict_lines as vl
from omniprobe.report.diffusers_view import diffusers_section
from omniprobe.report.emulation_view import emulation_section
from omniprobe.report.filters import flags_text, names, num, refs, span
from omniprobe.report.follow_through import follow_through
from omniprobe.report.memory_view import MemoryParts
from omniprobe.report.outputs_view import OutputParts
from omniprobe.report.paths import DETAILS_FILE, HARNESS_FILE, REPORT_DIR, TIMELINES_DIR
from omniprobe.report.provenance_view import (
    contract,
    is_harness_attempt,
    newest_upstream,
    provenance_rows,
    provenance_text,
)
from omniprobe.report.safe_text import safe_evidence
from omniprobe.report.timeline_svg import render_svg

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


def timeline_figures(view: ServeRunView, capacity_mib: float | None) -> list[TimelineFigure]:
    figures = []
    for index, life in enumerate(view.run.lifetimes):
        if life.timeline is None:
            continue
        markers = [
            (r.started_s, f"{r.fixture} seed {r.seed}: {r.outcome}")
            for r in view.attempt.requests
            if r.flag_set == view.flag_set and r.lifetime == index and r.started_s is not None
        ]
        title = f"{view.attempt.host} {view.attempt.id} {view.flag_set} #{index} ({life.session})"
        svg = render_svg(
            life.timeline.points,
            title=title,
            capacity_mib=capacity_mib,
            markers=markers,
            note=life.timeline.reason,
        )
        path = TIMELINES_DIR / view.attempt.host / view.attempt.id / f"{view.flag_set}-{index}.svg"
        figures.append(TimelineFigure(path.as_posix(), title, svg, life.timeline))
    return figures


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










def _cap_of(attempt: LoadedAttempt, capacity_mib: int | None) -> int | None:
    """The capacity line of an attempt's timelines: its emulated cap, else the modelled card's."""
    prov = attempt.meta.provenance
    return prov.cap_mib if prov.kind == "emulated" else capacity_mib


def _row_labels(views: list[ServeRunView]) -> list[str]:
    """A row is its flag set; where a flag set ran in several attempts, the attempt says which."""
    counts: dict[str, int] = {}
    for v in views:
        counts[v.flag_set] = counts.get(v.flag_set, 0) + 1
    first: set[str] = set()
    labels = []
    for v in views:
        if counts[v.flag_set] > 1 and v.flag_set in first:
            labels.append(f"{v.flag_set} ({v.attempt.id})")
        else:
            labels.append(v.flag_set)
        first.add(v.flag_set)
    return labels


def host_section(key: str, loaded: Loaded, verdict: HostVerdict) -> HostSection:
    hosts, fixtures = loaded.hosts, loaded.fixtures
    host = hosts.host(key)
    attempts = verdict_attempts(key, hosts, loaded.evidence)
    views = [v for a in attempts for v in run_views(a)]
    kv = kv_deltas(views, fixtures)
    refs_seen = sorted({fixtures.get(c.fixture).reference_count for v in views for c in v.cells})
    rows = []
    for view, label in zip(views, _row_labels(views), strict=True):
        cells: dict[int, Cell | None] = dict.fromkeys(refs_seen)
        for cell in view.cells:
            cells[fixtures.get(cell.fixture).reference_count] = cell
        rows.append(ServeRunRow(view, label, flags_text(hosts, view.flag_set),
                                vl.init_text(view.run.init), cells))
    stated_figures = {f.key: f for a in attempts for f in a.figures}
    capacity = host.capacity.vram_mib if host.capacity else None
    timelines = [t for v in views for t in timeline_figures(v, _cap_of(v.attempt, capacity))]
    baseline_ids = {a.meta.baseline for a in attempts if a.meta.baseline}
    baseline = next(
        (a for a in loaded.evidence.attempts if a.baseline is not None and a.id in baseline_ids), None
    )
    return HostSection(
        key=key,
        host=host,
        hosts=hosts,
        fixtures=fixtures,
        verdict=verdict,
        attempts=attempts,
        views=views,
        ref_columns=refs_seen,
        rows=rows,
        kv=kv,
        psnr=psnr_groups(attempts),
        target_ooms=target_ooms(views, fixtures, hosts.probe.target_reference_count),
        init_oom=common_init_oom([v.run for v in views]),
        stated_figures=stated_figures,
        baseline_name=(
            f"{baseline.baseline.engine}{'' if baseline.baseline.kv_cache else ' nocache'}"
            if baseline
            else "baseline"
        ),
        timelines=timelines,
        images=image_structures(attempts),
        disagreements=stated_disagreements(c for v in views for c in v.cells),
        estimates=estimate_checks(
            stated_figures, kv, views, hosts, host.serve_flag_sets, [o for a in attempts for o in a.structure]
        ),
        history=verdict_history(key, hosts, fixtures, loaded.evidence),
        baseline_attempt=baseline,
        steps=fixtures.sampling.num_inference_steps,
    )


def build_context(loaded: Loaded, settings: ReportSettings, root: Path) -> dict:
    """Everything the templates read; `settings`: templates/report.toml's; `root`: the project's,
    where the committed model configs are (the Diffusers section reads them). Every string of
    the evidence reaches the templates made safe for Markdown (safe_text.py)."""
    loaded = replace(loaded, evidence=safe_evidence(loaded.evidence))
    hosts = loaded.hosts
    verdicts = all_verdicts(hosts, loaded.fixtures, loaded.evidence)
    sections = [host_section(k, loaded, verdicts[k]) for k in hosts.hosts]
    by_key = {s.key: s for s in sections}
    # Diffusers hosts (a [diffusers] table) are the real-model section's, not the seed's study's.
    study = [s for s in sections if s.host.diffusers is None]
    emulated = [s for s in study if s.host.emulation is not None]
    real = [s for s in study if not s.host.simulated and s.host.emulation is None]
    diffusers = {s.key for s in sections if s.host.diffusers is not None}
    baselines = [a for a in loaded.evidence.attempts if a.baseline is not None]
    attempts = loaded.evidence.attempts
    study_attempts = [a for a in attempts
                      if not is_harness_attempt(a, hosts) and a.host not in diffusers]
    fixtures = loaded.fixtures
    return {
        "report": settings,
        # The cards come from the hosts: the title's words from templates/report.toml.
        "title": f"{settings.title} on "
                 + names([f"{s.host.name} ({num(s.host.vram_gb)} GB)" for s in real]),
        "stack": hosts.stack,
        "serve": hosts.serve,
        "fixtures": loaded.fixtures,
        "target": hosts.probe.target_reference_count,
        "sections": sections,
        "real": [s for s in real if s.has_evidence],
        "unprobed": [s for s in study if not s.has_evidence and not s.host.simulated],
        # An emulated simulated host is simulated: it goes to HARNESS.md with the others.
        "simulated": [s for s in sections if s.host.simulated and s.has_evidence],
        "emulated": [s for s in emulated if not s.host.simulated and s.has_evidence],
        "emulations": {s.key: emulation_section(s, by_key, loaded) for s in emulated if s.attempts},
        "baseline": baselines[0] if baselines else None,
        "attempts": study_attempts,
        "harness_attempts": [a for a in attempts if is_harness_attempt(a, hosts)],
        "study_provenance": provenance_rows(study_attempts, hosts),
        "diffusers_provenance": provenance_rows(
            [a for a in attempts if a.host in diffusers and not is_harness_attempt(a, hosts)
             and (hosts.host(a.host).emulation is not None or a.capacity)],
            hosts),
        "diffusers": diffusers_section(loaded, root),
        "follow": follow_through([s for s in real if s.has_evidence], hosts, settings),
        "upstream": newest_upstream(attempts),
        "contract": contract(newest_upstream(attempts)),
        "harness_file": HARNESS_FILE.as_posix(),
        "details_file": DETAILS_FILE.as_posix(),
        "provenance": {a.id: provenance_text(a.meta.provenance) for a in attempts},
        "seed_cite": next(
            (a.meta.provenance.source.cite() for a in attempts if a.meta.provenance.kind == "transcribed"),
            "not recorded",
        ),
        "seed_fixtures": [f for f in fixtures.fixtures if not f.simulated and not f.stands_in_for],
        "standins": [f for f in fixtures.fixtures if f.stands_in_for],
        "unknown_fixtures": [f for f in fixtures.fixtures if not f.simulated and f.missing_fields()],
        "unknown_deploy": [(n, d) for n, d in hosts.deploy_configs.items() if not d.content_known],
        "unknown_kwargs": [n for n, k in hosts.offline_kwarg_sets.items() if k.kwargs is None],
        "no_snapshot_manifest": hosts.env.checks.snapshot_manifest is None,
    }
