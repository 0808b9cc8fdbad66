"""A host section's account of memory: the conditioning KV, the OOMs, host RAM, the estimates and
the per-run details, decided from the evidence for the templates."""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe.analysis.estimates import EstimateCheck
from omniprobe.evidence.quantities import Range
from omniprobe.report import verdict_lines as vl
from omniprobe.report.filters import figure_text, num, seeds_text, span


@dataclass(frozen=True)
class Detail:
    """A run's per-fixture detail under the matrix."""

    label: str
    cells: tuple[str, ...]
    note: str | None


def estimate_note(c: EstimateCheck) -> str:
    if c.kind == "kv_per_reference":
        deltas = (f"the server-peak deltas from one reference to two ({', '.join(c.flag_sets)}) "
                  f"give {span(c.derived)} {c.unit} per reference (converted from the server's MB)")
        if c.below_spread and c.judgement != "disagrees":
            return (f"below the cells' own spread: those deltas are within the {num(c.spread)} "
                    f"{c.unit} the same cells' peaks spread")
        spread = f", the same cells' own peaks spread {num(c.spread)} {c.unit}" if c.spread else ""
        return deltas + spread
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


class MemoryParts:
    """The memory half of HostSection: every property reads the section's fields."""

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
