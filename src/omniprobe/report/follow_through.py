"""The follow-through for the downstream helper system, worded from the computed verdicts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from omniprobe.config.hosts import HostsConfig
from omniprobe.config.report_settings import ReportSettings
from omniprobe.evidence.models.statements import CodeLocation
from omniprobe.report import verdict_lines as vl
from omniprobe.report.filters import count_range, figure_text, names, refs, span

if TYPE_CHECKING:
    from omniprobe.report.host_section import HostSection


@dataclass
class FollowThrough:
    lines: list[tuple[str, str]]
    seams: list[CodeLocation]
    not_the_cache: str | None = None  # why a spill path would change no verdict, where none would


def follow_through(real: list[HostSection], hosts: HostsConfig, r: ReportSettings) -> FollowThrough:
    lines = []
    for s in real:
        v = s.verdict
        if v.verdict == "built":
            lines.append(
                (
                    f"#{r.serving_profile_issue} ({s.host.name})",
                    f"the vLLM-Omni path serves {refs(v.target_refs)} with sound output under "
                    f"{names(vl.config_names(v.served_by, v.unreached))}; candidacy holds for "
                    f"{v.target_refs}-reference profiles on {s.host.vram_gb} GB.",
                )
            )
        elif v.verdict == "not-built" and v.blocker == "init":
            where = f" (`{s.init_oom.location}`)" if s.init_oom is not None else ""
            extra = "".join(f"; {f.statement}" for f in s.findings("follow-through"))
            lines.append(
                (
                    f"#{r.topology_issue} ({s.host.name}, topology input)",
                    f"the card cannot host this stack at all — the init-time allocation fails before "
                    f"any flag acts{where}. Any topology plan pairing it with {hosts.stack.model_repo} on "
                    f"vLLM-Omni needs upstream load-path work (quantized or CPU-materialized init) "
                    f"first{extra}.",
                )
            )
        elif v.verdict == "not-built":
            lines.append(
                (f"#{r.serving_profile_issue} ({s.host.name}, serving-profile candidacy)", _candidacy(s))
            )
    seams = [loc for s in real for loc in s.seams]
    return FollowThrough(lines, seams, not_the_cache(real))


def not_the_cache(real: list[HostSection]) -> str | None:
    """Where no probed card is bound by its conditioning cache: what binds each instead."""
    binds = [vl.what_binds(s) for s in real]
    if not real or any(b is None for b in binds):
        return None
    cards = "either card" if len(real) == 2 else "any probed card"
    each = "; ".join(f"{s.host.name}: {b}" for s, b in zip(real, binds, strict=True))
    verdicts = "neither verdict" if len(real) == 2 else "no verdict"
    return (f"the cache itself is not the binding constraint on {cards} ({each}), so a spill path alone "
            f"would change {verdicts}")


def _candidacy(s: HostSection) -> str:
    v, hosts, target = s.verdict, s.hosts, s.verdict.target_refs
    if not v.highest_served_refs:
        return (
            f"no reference count is served with sound output; no candidacy. {target}-reference "
            "profiles remain on the baseline engine."
        )
    walls = [
        x
        for row in s.rows
        if row.view.flag_set in v.served_by or row.view.flag_set in {u.flag_set for u in v.unreached}
        for count, c in row.cells.items()
        if c is not None and c.wall_s and c.structure == "sound" and 0 < count <= v.highest_served_refs
        for x in (c.wall_s.min, c.wall_s.max)
    ]
    counts = count_range(list(range(1, v.highest_served_refs + 1)))
    text = f"the vLLM-Omni path serves {counts} reference{'s' if v.highest_served_refs > 1 else ''}"
    if walls:
        text += f" at {int(min(walls))}–{-int(-max(walls) // 1)} s/image"
    sp = s.ceiling_speedup
    if sp is not None:
        text += f", {span(sp.speedup, 1)}× the {s.baseline_name} baseline"
    kv, ret = (
        s.stated_figures.get("kv_per_reference"),
        s.stated_figures.get("diffusers_retention_per_reference"),
    )
    if kv is not None and ret is not None:
        text += (
            f"; per-request cache pressure (the seed's estimate: {figure_text(kv)} per reference) "
            "means concurrent "
            f"multi-reference sessions do not accumulate Diffusers-style {figure_text(ret)}-per-reference "
            "retention"
        )
    text += (
        f". Candidacy holds for ≤{v.highest_served_refs}-reference profiles on {s.host.vram_gb} GB; "
        f"{target}-reference profiles remain on the baseline engine"
    )
    if v.blocker == "structure":
        unlocks = list(dict.fromkeys(u.flag_set for u in v.capacity_unlocks))
        fits = [
            f"all {len(vl.fitting_counts(s, f))} counts fit"
            if vl.fitting_counts(s, f) == vl.ran_counts(s, f)
            else f"{names(str(n) for n in vl.fitting_counts(s, f))} references fit"
            for f in unlocks
        ]
        sp4 = next((s.speedup_of(u) for u in v.capacity_unlocks if s.speedup_of(u)), None)
        detail = fits[0] + (f", {span(sp4.speedup, 1)}× baseline speed" if sp4 else "")
        text += (
            f": {names(unlocks)} unlocks the capacity ({detail}) but its output is broken, so the unlock "
            "order is upstream output correctness first, then serving"
        )
    for f in s.findings("follow-through"):
        text += f"; {f.statement}"
    del hosts
    return text + "."
