"""A host section's account of its outputs: image structure, PSNR, speed-ups, determinism,
offline rows and propagation, decided from the evidence for the templates."""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe.analysis.verdicts import (
    CapacityUnlock,
)
from omniprobe.evidence.quantities import Range
from omniprobe.report import verdict_lines as vl
from omniprobe.report.filters import figure_text, kwargs_text, names, num, refs, seeds_text, span


@dataclass(frozen=True)
class StructureRow:
    scope: str
    runs: str
    opaque: str
    not_opaque: str
    alpha: str
    rgb: str
    psnr: str
    structure: str
    note: str | None


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


class OutputParts:
    """The output half of HostSection: every property reads the section's fields."""

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
            and x.structure == "sound"
        ]
        return found[0] if found else None

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
                    o.structure,
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
        for o in self.offline_results():
            ks = self.hosts.offline_kwarg_sets.get(o.configuration)
            kwargs = (
                kwargs_text(ks.kwargs) + "".join(f" `{k}={v}`" for k, v in ks.env.items())
                if ks is not None and ks.kwargs is not None
                else "not stated"
            )
            fixture = (o.fixture or "not stated") + (f" ({seeds_text(o.seeds)})" if o.seeds else "")
            outcome = f"**{o.outcome.upper()}**" + (
                f", output {o.structure}" if o.structure != "unchecked" else ""
            )
            detail = "; ".join(x for x in (oom_detail(o.oom) if o.oom else None, o.note) if x) or "—"
            rows.append((o.configuration, kwargs, fixture, outcome, detail))
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
            for o in self.offline_results()
            if o.outcome == "oom"
            and o.fixture
            and self.fixtures.get(o.fixture).reference_count == self.verdict.target_refs
        ]
        kv = self.stated_figures.get("kv_per_reference")
        if still and kv is not None and self.kv_not_binding:
            notes.append(
                f"{names(list(dict.fromkeys(o.configuration for o in still)))} still run out of memory at "
                f"{refs(self.verdict.target_refs)} with the cache quantized, on the same ask: by the "
                f"seed's estimate ({figure_text(kv)} per reference, from peak deltas) quantizing it "
                "cannot bridge the gap; only a leaner resident working set would."
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
                    g.structure,
                )
            )
        return rows

    @property
    def psnr_note(self) -> str | None:
        b = self.baseline_attempt
        if b is None or not any(g.structure == "sound" for g in self.psnr):
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
            if sp.structure == "sound" or sp.reference_count == target:
                groups.setdefault((sp.fixture, sp.structure, span(sp.speedup, 1)), []).append(sp)
        denoise = self.stated_figures.get("denoise_step_latency")
        denoise_attempt = next(
            (a.id for a in self.attempts if "denoise_step_latency" in {f.key for f in a.figures}), None
        )
        lines = []
        for (fixture, structure, speedup), found in groups.items():
            shown = names(dict.fromkeys(vl.config_names([sp.flag_set for sp in found], v.unreached)))
            wall = Range.of(x for sp in found for x in (sp.wall_s.min, sp.wall_s.max))
            text = (
                f"{shown}, {fixture}: {span(wall)} s per image against the baseline's "
                f"{num(found[0].baseline_wall_s)} s — {speedup}× faster"
            )
            if structure != "sound":
                text += f", but the output is {structure}"
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
        broken = [g for g in self.psnr if g.structure == "broken"]
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
