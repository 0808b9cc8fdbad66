"""The seed report's own estimates held against what the measurements derive, judged fairly.

A figure the seed states as its estimate stays quoted, with one of three judgements:
- consistent: the measurements bracket it (or lie inside it, at the precision it is written with);
- not confirmed: they neither bracket it nor refute it: they fall outside it by no more than their
  own spread (seed to seed, and the same cell across attempts), or they are differences no larger
  than that spread, which bracket anything near them and so cannot confirm it, or the only
  evidence is allocator high-water marks of different configurations, which cannot measure what
  one configuration frees;
- disagrees: every measurement falls outside it by more than the measurements' own spread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from omniprobe.analysis.derived import KvDelta, rounded_to, written_decimals
from omniprobe.analysis.summaries import ServeRunView
from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.models.outputs import StructureObservation
from omniprobe.evidence.models.statements import StatedFigure
from omniprobe.evidence.quantities import Range

MB = 1000**2
GIB = 1024**3
MB_PER_GIB = GIB / MB

Judgement = Literal["consistent", "not confirmed", "disagrees"]


@dataclass(frozen=True)
class EstimateCheck:
    """One estimate against its derived counterpart.

    kind says which comparison it is (the template words each): 'kv_per_reference' (per-reference
    growth of the server peak), 'fp8_frees' (how much lower the fp8 server peaks are than the base
    flag set's at the same fixture), 'transparency' (the largest fully transparent fraction the
    alpha mean allows; not_opaque: the fraction not fully opaque, from the opaque fraction)."""

    kind: str
    key: str
    stated: Range
    unit: str
    derived: Range
    judgement: Judgement
    flag_sets: tuple[str, ...] = ()
    fixtures: tuple[str, ...] = ()
    not_opaque: Range | None = None
    spread: float = 0.0  # the measurements' own spread, in `unit`
    below_spread: bool = False  # differences no larger than the cells' own spread: noise


    @property
    def agrees(self) -> bool:
        return self.judgement == "consistent"


def stated_range(f: StatedFigure) -> Range | None:
    """A stated figure as a range (a single value as both ends); None: it states neither."""
    if f.range is not None:
        return f.range
    return Range(min=f.value, max=f.value) if f.value is not None else None


def within(derived: Range, stated: Range) -> bool:
    """The derived range, rounded to the stated precision, lies inside the stated range."""
    digits = max(written_decimals(stated.min), written_decimals(stated.max))
    return (rounded_to(stated.min, digits) <= rounded_to(derived.min, digits)
            and rounded_to(derived.max, digits) <= rounded_to(stated.max, digits))


def brackets(derived: Range, stated: Range) -> bool:
    """The measurements reach both sides of the estimate, or lie inside it at its precision."""
    return (derived.min <= stated.min and stated.max <= derived.max) or within(derived, stated)


def judge(derived: Range, stated: Range, spread: float, below_spread: bool = False) -> Judgement:
    """`below_spread`: the derived figures are differences within the measurements' own spread,
    so bracketing the estimate confirms nothing; lying beyond it by more than the spread still
    refutes it."""
    if derived.max + spread < stated.min or derived.min - spread > stated.max:
        return "disagrees"
    if brackets(derived, stated) and not below_spread:
        return "consistent"
    return "not confirmed"


def peak_spread_mb(views: list[ServeRunView], cells: set[tuple[str, str]]) -> float:
    """The widest spread of the server peaks of one (flag set, fixture) cell: seed to seed within
    an attempt, and between the attempts that measured the same cell."""
    peaks: dict[tuple[str, str], list[float]] = {}
    for v in views:
        for c in v.cells:
            if (v.flag_set, c.fixture) in cells and c.server_peak_mb is not None and c.outcome == "ok":
                peaks.setdefault((v.flag_set, c.fixture), []).extend(
                    (c.server_peak_mb.min, c.server_peak_mb.max))
    return max((max(p) - min(p) for p in peaks.values()), default=0.0)


def kv_check(figure: StatedFigure, deltas: list[KvDelta],
             views: list[ServeRunView] = ()) -> EstimateCheck | None:
    """The per-reference KV estimate (GiB) against the 1→2 reference server-peak deltas (MB)."""
    stated = stated_range(figure)
    if stated is None or figure.unit != "GiB" or not deltas:
        return None
    derived = Range.of(round(d.delta_mb / MB_PER_GIB, 2) for d in deltas)
    cells = {(d.flag_set, f) for d in deltas for f in (d.one_ref_fixture, d.two_ref_fixture)}
    spread = round(peak_spread_mb(list(views), cells) / MB_PER_GIB, 2)
    noise = derived.max <= spread
    return EstimateCheck("kv_per_reference", figure.key, stated, figure.unit, derived,
                         judge(derived, stated, spread, noise),
                         tuple(dict.fromkeys(d.flag_set for d in deltas)), spread=spread,
                         below_spread=noise)


def quantization_base(hosts: HostsConfig, flag_set: str, method: str) -> str | None:
    """The flag set that is `flag_set` without `--quantization <method>` (same env and deploy)."""
    fs = hosts.flag_sets[flag_set]
    args = list(fs.args)
    for i in range(len(args) - 1):
        if args[i] == "--quantization" and args[i + 1] == method:
            base_args = args[:i] + args[i + 2:]
            break
    else:
        return None
    for name, other in hosts.flag_sets.items():
        if (list(other.args) == base_args and other.env == fs.env
                and other.deploy_config == fs.deploy_config):
            return name
    return None


def _peaks(views: list[ServeRunView], flag_set: str) -> dict[str, float]:
    return {c.fixture: c.server_peak_mb.max for v in views if v.flag_set == flag_set
            for c in v.cells if c.outcome == "ok" and c.server_peak_mb is not None}


def fp8_frees_check(figure: StatedFigure, views: list[ServeRunView], hosts: HostsConfig,
                    flag_sets: list[str]) -> EstimateCheck | None:
    """What fp8 is said to free (GiB) against how much lower its server peaks are than its base
    flag set's at the same fixtures."""
    stated = stated_range(figure)
    if stated is None or figure.unit != "GiB":
        return None
    freed, names, fixtures = [], [], []
    for name in flag_sets:
        base = quantization_base(hosts, name, "fp8")
        if base is None:
            continue
        quantized, plain = _peaks(views, name), _peaks(views, base)
        for fixture in quantized.keys() & plain.keys():
            freed.append(round((plain[fixture] - quantized[fixture]) / MB_PER_GIB, 2))
            names += [name, base]
            fixtures.append(fixture)
    if not freed:
        return None
    derived = Range.of(freed)
    # Peaks of two configurations are high-water marks of different allocations: they can bracket
    # what quantization frees, never refute it.
    judgement: Judgement = "consistent" if brackets(derived, stated) else "not confirmed"
    return EstimateCheck("fp8_frees", figure.key, stated, figure.unit, derived, judgement,
                         tuple(dict.fromkeys(names)), tuple(sorted(set(fixtures))))


def transparency_check(o: StructureObservation, opaque_alpha: int) -> EstimateCheck | None:
    """A stated transparent fraction against the alpha mean: fully transparent pixels have alpha 0
    and none has more than opaque_alpha, so at most 1 - mean/opaque_alpha of them can be."""
    if o.transparent_fraction is None or o.alpha_mean is None:
        return None
    most_transparent = round(1 - o.alpha_mean.min / opaque_alpha, 3)
    derived = Range(min=0, max=max(0.0, most_transparent))
    not_opaque = (Range(min=round(1 - o.opaque_fraction.max, 3), max=round(1 - o.opaque_fraction.min, 3))
                  if o.opaque_fraction is not None else None)
    # The alpha mean bounds the fully transparent fraction exactly: above it, none can be.
    judgement: Judgement = ("consistent" if o.transparent_fraction.min <= most_transparent
                            else "disagrees")
    return EstimateCheck("transparency", o.scope, o.transparent_fraction, "", derived, judgement,
                         (o.flag_set,) if o.flag_set else (), tuple(o.fixtures), not_opaque)


def estimate_checks(figures: dict[str, StatedFigure], deltas: list[KvDelta], views: list[ServeRunView],
                    hosts: HostsConfig, flag_sets: list[str],
                    structure: list[StructureObservation]) -> dict[str, EstimateCheck]:
    """Every check the evidence allows, keyed by the stated figure's key or the structure scope."""
    checks = []
    if "kv_per_reference" in figures:
        checks.append(kv_check(figures["kv_per_reference"], deltas, views))
    if "fp8_frees" in figures:
        checks.append(fp8_frees_check(figures["fp8_frees"], views, hosts, flag_sets))
    checks += [transparency_check(o, hosts.structure.opaque_alpha) for o in structure]
    return {c.key: c for c in checks if c is not None}
