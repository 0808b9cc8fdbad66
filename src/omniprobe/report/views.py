"""The report's view models: every decision the report makes, prepared for the templates.

Templates loop over the items here and test whether one is present; which flag sets block, which
OOMs came early, which code-read facts are seams, what an estimate's judgement is and how the
run-matrix rows are labelled are all decided here, from the evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    CapacityUnlock,
    HistoryEntry,
    HostVerdict,
    all_verdicts,
    verdict_attempts,
    verdict_history,
)
from omniprobe.config.fixtures import FixtureSuite
from omniprobe.config.host_entry import Host
from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.load import LoadedAttempt
from omniprobe.evidence.models.runs import Cell
from omniprobe.evidence.models.statements import CodeLocation, StatedFigure
from omniprobe.evidence.quantities import Range
from omniprobe.evidence.validate import Loaded
from omniprobe.report import verdict_lines as vl
from omniprobe.report.diffusers_view import diffusers_section
from omniprobe.report.emulation_view import emulation_section
from omniprobe.report.filters import figure_text, flags_text, kwargs_text, names, num, refs, seeds_text, span
from omniprobe.report.follow_through import follow_through
from omniprobe.report.paths import HARNESS_FILE, REPORT_DIR, TIMELINES_DIR
from omniprobe.report.provenance_view import contract, is_harness_attempt, newest_upstream, provenance_text
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


@dataclass(frozen=True)
class Detail:
    """A run's per-fixture detail under the matrix."""

    label: str
    cells: tuple[str, ...]
    note: str | None


@dataclass(frozen=True)
class StructureRow:
    scope: str
    runs: str
    opaque: str
    not_opaque: str
    alpha: str
    rgb: str
    psnr: str
    quality: str
    note: str | None


@dataclass
class HostSection:
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

    def speedup_of(self, unlock: CapacityUnlock):
        """The speed-up of exactly the unlock's cell (attempt, flag set, fixture), if any."""
        found = [
            x
            for x in self.verdict.speedups
            if (x.attempt, x.flag_set, x.fixture) == (unlock.attempt, unlock.flag_set, unlock.fixture)
        ]
        return found[0] if found else None

    @property
    def ceiling_speedup(self):
        v = self.verdict
        found = [
            x
            for x in v.speedups
            if x.flag_set in v.served_by
            and x.reference_count == v.highest_served_refs
            and x.quality == "sound"
        ]
        return found[0] if found else None

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
    def init_oom_what(self) -> list[str]:
        oom = self.init_oom
        return [loc.what for loc in self.collect("code_read") if oom is not None and loc.ref == oom.location]

    @property
    def kv_range(self) -> Range | None:
        return Range.of(d.delta_mb for d in self.kv) if self.kv else None

    @property
    def kv_gib(self) -> Range | None:
        return vl.kv_per_reference_gib(self.kv)

    @property
    def kv_not_binding(self) -> bool:
        signature = next((c.oom.requested for _, c in self.target_ooms if c.oom.requested), None)
        return vl.kv_excluded(self, signature)

    @property
    def kv_items(self) -> str:
        return "; ".join(
            f"{d.flag_set}: {num(d.one_ref_peak_mb)}→{num(d.two_ref_peak_mb)} MB" for d in self.kv
        )

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
    def samplers(self) -> str | None:
        found = list(dict.fromkeys(v.run.gpu_sampler for v in self.views if v.run.gpu_sampler))
        return " / ".join(found) if found else None

    @property
    def details(self) -> list[Detail]:
        labels = {id(r.view): r.label for r in self.rows}
        out = []
        for v in self.views:
            cells = tuple(
                f"{c.fixture} {span(c.wall_s)} s"
                + (f" (peak {span(c.server_peak_mb)} MB)" if c.server_peak_mb else "")
                + f", {seeds_text(c.seeds)}"
                for c in v.cells
                if c.seeds and c.wall_s
            )
            if cells or v.run.note:
                out.append(Detail(labels[id(v)], cells, v.run.note))
        return out

    @property
    def disagreement_lines(self) -> list[str]:
        def unit(d, stated):
            return "s" if d.figure == "wall_s" else ("MB server peak" if stated else "MB")

        return [
            f"{d.fixture}: {span(d.stated)} {unit(d, True)} in {d.where}; the detail gives "
            f"{span(d.detail)} {unit(d, False)}."
            for d in self.disagreements
        ]

    @property
    def host_ram_line(self) -> str | None:
        host, f = self.host, self.stated_figures.get("bf16_weights")
        if self.init_oom is None or not host.host_ram_gib or f is None:
            return None
        ram = host.host_ram_note or f"{num(host.host_ram_gib)} GiB"
        return (
            f"Host RAM ({ram}) is a separate ceiling for full weight offload ({figure_text(f)} of "
            "BF16 weights) but is not what kills these runs."
        )

    @property
    def oom_rows(self) -> list[tuple[str, ...]]:
        return [
            (
                flag_set + (" (stand-in)" if cell.inputs == "stand-in" else ""),
                cell.oom.requested or "not stated",
                cell.oom.allocated or "not stated",
                cell.oom.reserved_unallocated or "not stated",
                (
                    f"`{cell.oom.location}`" + (f" via `{cell.oom.via}`" if cell.oom.via else "")
                    if cell.oom.location
                    else "not stated"
                )
                + (f" — {cell.oom.note}" if cell.oom.note else ""),
            )
            for flag_set, cell in self.target_ooms
        ]

    @property
    def determinism_lines(self) -> list[str]:
        return [
            f"{g.fixture} seed {g.seed} outputs are {'byte' if g.compared == 'bytes' else 'pixel'}-identical"
            f"{'' if g.identical else ' NOT'} across {', '.join(g.flag_sets)} (sha256 `{g.sha256_prefix}…`)"
            for g in self.collect("determinism")
        ]

    @property
    def structure_rows(self) -> list[StructureRow]:
        rows = []
        for o in self.collect("structure"):
            approx = "~" if o.approximate else ""
            not_opaque = (
                Range(min=round(1 - o.opaque_fraction.max, 3), max=round(1 - o.opaque_fraction.min, 3))
                if o.opaque_fraction is not None
                else None
            )
            rows.append(
                StructureRow(
                    o.scope,
                    o.flag_set or o.kwarg_set or "—",
                    _opt(o.opaque_fraction),
                    _opt(not_opaque),
                    _opt(o.alpha_mean, approx),
                    _opt(o.rgb_mean, approx),
                    _opt(o.psnr_db),
                    o.quality,
                    o.note,
                )
            )
        return rows

    @property
    def transparency_notes(self) -> list[str]:
        notes = []
        for o in self.collect("structure"):
            c = self.estimates.get(o.scope)
            if c is not None and c.judgement == "disagrees":
                notes.append(
                    f'The seed report\'s "{span(c.stated)} transparent" ({o.scope}) reads as not fully '
                    f"opaque: an alpha mean of {span(o.alpha_mean)} allows at most {num(c.derived.max)} "
                    "of the pixels to be fully transparent."
                )
        return notes

    @property
    def corrections(self) -> list[str]:
        out = []
        for c in self.collect("corrections"):
            text = f'**Correction to {c.subject}**: it claimed "{c.claimed}"; {c.finding}'
            if c.opaque_fraction is not None:
                text += f" (opaque fraction {num(c.opaque_fraction)}"
                text += f" in {', '.join(c.artifacts)})" if c.artifacts else ")"
            text += "."
            if c.stands:
                figure = self.stated_figures.get(c.stands_figure or "")
                shown = f" ({figure_text(figure)})" if figure is not None else ""
                text += f" {c.stands[:1].upper()}{c.stands[1:]}{shown} stands"
                text += f"; {c.falls} does not." if c.falls else "."
            out.append(text)
        return out

    @property
    def offline_rows(self) -> list[tuple[str, ...]]:
        rows = []
        for o in self.collect("offline"):
            ks = self.hosts.offline_kwarg_sets.get(o.kwarg_set)
            kwargs = (
                kwargs_text(ks.kwargs) + "".join(f" `{k}={v}`" for k, v in ks.env.items())
                if ks is not None and ks.kwargs is not None
                else "not stated"
            )
            fixture = (o.fixture or "not stated") + (f" ({seeds_text(o.seeds)})" if o.seeds else "")
            outcome = f"**{o.outcome.upper()}**" + (
                f", output {o.quality}" if o.quality != "unchecked" else ""
            )
            detail = "; ".join(x for x in (oom_detail(o.oom) if o.oom else None, o.note) if x) or "—"
            rows.append((o.kwarg_set, kwargs, fixture, outcome, detail))
        return rows

    @property
    def offline_notes(self) -> list[str]:
        notes = [
            f"{u.flag_set} ran as {u.base}: its `{u.knob}` never reached the model offline (see "
            f'"Propagation gap"), so its rows are {u.base}\'s configuration, not a separate one.'
            for u in self.verdict.unreached_offline
        ]
        still = [
            o
            for o in self.collect("offline")
            if o.outcome == "oom"
            and o.fixture
            and self.fixtures.get(o.fixture).reference_count == self.verdict.target_refs
        ]
        kv = self.stated_figures.get("kv_per_reference")
        if still and kv is not None and self.kv_not_binding:
            notes.append(
                f"{names(list(dict.fromkeys(o.kwarg_set for o in still)))} still run out of memory at "
                f"{refs(self.verdict.target_refs)}: the conditioning cache contributes only "
                f"{figure_text(kv)} per reference, so quantizing it cannot bridge the gap; only a "
                "leaner resident working set would."
            )
        return notes

    @property
    def psnr_rows(self) -> list[tuple[str, ...]]:
        labels = {(r.view.attempt.id, r.view.flag_set): r.label for r in self.rows}
        rows = []
        for g in self.psnr:
            values = (
                " / ".join("identical" if r.identical else num(r.psnr_db.min) for r in g.rows)
                if g.per_seed
                else f"{num(g.low_db)}–{num(g.high_db)}"
            )
            mean = (f"{g.mean_db:,.2f}" if g.mean_db is not None else "—") + (
                "" if g.per_seed else " (stated)"
            )
            rows.append(
                (
                    labels.get((g.attempt, g.flag_set), g.flag_set),
                    g.fixture,
                    seeds_text(g.seeds),
                    values,
                    mean,
                    f"{g.comparator.upper()} vs `{g.baseline}`",
                    g.quality,
                )
            )
        return rows


    @property
    def psnr_note(self) -> str | None:
        b = self.baseline_attempt
        if b is None or not any(g.quality == "sound" for g in self.psnr):
            return None
        return (
            f"PSNR of sound rows is cross-implementation agreement at matched seed and inputs, not parity: "
            f"the baseline ran {b.baseline.engine} with {b.baseline.dit}, KV cache "
            f"{'on' if b.baseline.kv_cache else 'off'}."
        )

    @property
    def speedup_lines(self) -> list[str]:
        """One line per fixture and outcome, the flag sets that share it together."""
        v, target = self.verdict, self.verdict.target_refs
        groups: dict[tuple, list] = {}
        for sp in v.speedups:
            if sp.quality == "sound" or sp.reference_count == target:
                groups.setdefault((sp.fixture, sp.quality, span(sp.speedup, 1)), []).append(sp)
        denoise = self.stated_figures.get("denoise_step_latency")
        denoise_attempt = next(
            (a.id for a in self.attempts if "denoise_step_latency" in {f.key for f in a.figures}), None
        )
        lines = []
        for (fixture, quality, speedup), found in groups.items():
            shown = names(dict.fromkeys(vl.config_names([sp.flag_set for sp in found], v.unreached)))
            wall = Range.of(x for sp in found for x in (sp.wall_s.min, sp.wall_s.max))
            text = (
                f"{shown}, {fixture}: {span(wall)} s per image against the baseline's "
                f"{num(found[0].baseline_wall_s)} s — {speedup}× faster"
            )
            if quality != "sound":
                text += f", but the output is {quality}"
                unquantized_fit = any(
                    c.outcome == "ok"
                    for r in self.rows
                    if not vl.quantization(self.hosts, r.view.flag_set)
                    for c in [r.cells.get(target)]
                    if c is not None
                )
                if not unquantized_fit:
                    text += f": fast but not usable, and no valid {vl.UNQUANTIZED} number exists"
                for f in self.findings("speed"):
                    text += f"; {f.statement}"
            elif denoise is not None and denoise_attempt in {sp.attempt for sp in found}:
                row = next(r for r in self.rows if r.view.attempt.id == denoise_attempt)
                text += (
                    f"; in the {row.label} run the server's denoise step is "
                    f"{figure_text(denoise)} × {self.steps} steps"
                )
            lines.append(text + ".")
        return lines

    @property
    def broken_psnr_line(self) -> str | None:
        broken = [g for g in self.psnr if g.quality == "broken"]
        if not broken:
            return None
        return (
            f"The {self.verdict.target_refs}-reference PSNR cell is obtainable only under "
            f"{names(list(dict.fromkeys(g.flag_set for g in broken)))}, and there it is meaningless as "
            "quality: the outputs are the collapsed renders above, recorded as the broken-output datum, "
            "not as a usable comparison."
        )

    @property
    def propagation_items(self) -> list[tuple[str, list[str]]]:
        return [propagation_text(p) for p in self.collect("propagation")]

    @property
    def estimate_rows(self) -> list[tuple[str, ...]]:
        rows = []
        for f in self.stated_figures.values():
            c = self.estimates.get(f.key)
            judged = (
                f"{'**disagrees**' if c.judgement == 'disagrees' else c.judgement}: {estimate_note(c)}"
                if c is not None
                else "—"
            )
            rows.append(
                (f.label or f.key.replace("_", " ").capitalize(), figure_text(f), f.statement, judged)
            )
        return rows

    @property
    def kv_estimate_line(self) -> str | None:
        c = self.estimates.get("kv_per_reference")
        return (
            None
            if c is None
            else f"Against that estimate the measurements are {c.judgement}: {estimate_note(c)}."
        )

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


def _opt(r: Range | None, prefix: str = "") -> str:
    return "—" if r is None else prefix + span(r)


def oom_detail(o) -> str:
    text = f"{o.allocated} allocated" if o.allocated else ""
    if o.reserved_unallocated:
        text += f" + {o.reserved_unallocated} reserved-unallocated"
    if o.requested:
        text += f"; a {o.requested} ask"
    if o.location:
        text += f" at `{o.location}`"
    return text


def estimate_note(c: EstimateCheck) -> str:
    if c.kind == "kv_per_reference":
        spread = f", the same cells' own peaks spread {num(c.spread)} {c.unit}" if c.spread else ""
        return (
            f"the server-peak deltas from one reference to two ({', '.join(c.flag_sets)}) give "
            f"{span(c.derived)} {c.unit} per reference (converted from the server's MB){spread}"
        )
    if c.kind == "fp8_frees":
        return (
            f"the server peaks under {' and '.join(c.flag_sets)} at {', '.join(c.fixtures)} differ by "
            f"{span(c.derived)} {c.unit} (converted from the server's MB), but they are allocator "
            "high-water marks of different "
            "configurations"
        )
    return (
        f"an alpha mean of that level allows at most {num(c.derived.max)} of the pixels to be fully "
        "transparent"
    )


def propagation_text(p) -> tuple[str, list[str]]:
    title = "Propagation gap" if p.reached_model is False else "Propagation check"
    lines = []
    identical = "byte-identical" if p.bytes_identical else "pixel-identical"
    if p.via == "offline" and p.reached_model is not None:
        lines.append(
            f"The `Omni(...)` kwarg `{p.knob}` "
            + (
                "**does not reach the model offline**"
                if p.reached_model is False
                else "reaches the model offline"
            )
            + f": offline outputs with ({p.flag_set_with}) and without ({p.flag_set_without}) it "
            + ("differ" if p.reached_model else f"are {identical}")
            + "."
        )
    elif p.reached_model is False:
        lines.append(
            f"The deploy-config route for `{p.knob}` **does not reach the model through "
            f"`vllm serve`**: serve outputs with ({p.flag_set_with}) and without "
            f"({p.flag_set_without}) it are {identical}."
        )
    elif p.reached_model:
        lines.append(
            f"The deploy-config route for `{p.knob}` reaches the model: outputs with "
            f"({p.flag_set_with}) and without ({p.flag_set_without}) it differ."
        )
    else:
        lines.append(f"Whether `{p.knob}` reaches the model was not measured.")
    if p.deploy_config_ignored:
        lines.append(
            "The server's log carries upstream's warning that it ignored the deploy config "
            '("No registered PipelineConfig resolved for model …").'
        )
    if p.dropped_at:
        lines.append(f"The knob is lost in {p.dropped_at}.")
    if p.shapes_tried:
        lines.append(f"Shapes tried: {'; '.join(p.shapes_tried)}.")
    if p.offline_kwarg_accepted:
        lines.append("The offline `Omni(...)` engine kwarg is accepted.")
    if p.note:
        lines.append(f"{p.note[:1].upper()}{p.note[1:]}.")
    return title, lines


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


def build_context(loaded: Loaded, root: Path) -> dict:
    """Everything the templates read; `root`: the project's, where the committed model configs
    are (the Diffusers section reads them)."""
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
    fixtures = loaded.fixtures
    return {
        "stack": hosts.stack,
        "serve": hosts.serve,
        "fixtures": loaded.fixtures,
        "target": hosts.probe.target_reference_count,
        "sections": sections,
        "real": [s for s in real if s.has_evidence],
        "unprobed": [s.host.name for s in study if not s.has_evidence and not s.host.simulated],
        # An emulated simulated host is simulated: it goes to HARNESS.md with the others.
        "simulated": [s for s in sections if s.host.simulated and s.has_evidence],
        "emulated": [s for s in emulated if not s.host.simulated and s.has_evidence],
        "emulations": {s.key: emulation_section(s, by_key, loaded) for s in emulated if s.attempts},
        "baseline": baselines[0] if baselines else None,
        "hosts_word": "both" if len(real) == 2 else "all",
        "dates": ", ".join(dict.fromkeys(a.meta.date for s in real for a in s.attempts if a.runs)),
        "attempts": [a for a in attempts if not is_harness_attempt(a, hosts) and a.host not in diffusers],
        "harness_attempts": [a for a in attempts if is_harness_attempt(a, hosts)],
        "diffusers": diffusers_section(loaded, root),
        "follow": follow_through([s for s in real if s.has_evidence], hosts),
        "upstream": newest_upstream(attempts),
        "contract": contract(newest_upstream(attempts)),
        "harness_file": HARNESS_FILE.as_posix(),
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
