"""Figures the report derives from evidence: KV deltas, PSNR means, shared OOM signatures."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from statistics import fmean

from omniprobe.analysis.summaries import ServeRunView
from omniprobe.config.fixtures import FixtureSuite
from omniprobe.evidence.load import LoadedAttempt
from omniprobe.evidence.models.common import OomSignature
from omniprobe.evidence.models.outputs import PsnrRow
from omniprobe.evidence.models.requests import ImageMetrics
from omniprobe.evidence.models.runs import Cell, ServeRun
from omniprobe.evidence.quantities import Range


@dataclass(frozen=True)
class KvDelta:
    """How much the per-request server peak grows from one reference to two, in one run."""

    attempt: str
    flag_set: str
    one_ref_peak_mb: float
    two_ref_peak_mb: float
    one_ref_fixture: str = ""
    two_ref_fixture: str = ""

    @property
    def delta_mb(self) -> float:
        return self.two_ref_peak_mb - self.one_ref_peak_mb


def _peak_at(cells, fixtures: FixtureSuite, refs: int) -> tuple[float, str] | None:
    """The highest server peak at a reference count, with the fixture it was measured on."""
    peaks = [(c.server_peak_mb.max, c.fixture) for c in cells
             if c.server_peak_mb is not None and c.outcome == "ok"
             and fixtures.get(c.fixture).reference_count == refs]
    return max(peaks) if peaks else None


def kv_deltas(views: list[ServeRunView], fixtures: FixtureSuite) -> list[KvDelta]:
    out = []
    for view in views:
        one, two = _peak_at(view.cells, fixtures, 1), _peak_at(view.cells, fixtures, 2)
        if one is not None and two is not None:
            out.append(KvDelta(view.attempt.id, view.flag_set, one[0], two[0], one[1], two[1]))
    return out


@dataclass(frozen=True)
class PsnrGroup:
    attempt: str
    flag_set: str
    fixture: str
    rows: tuple[PsnrRow, ...]

    @property
    def per_seed(self) -> bool:
        return all(len(r.seeds) == 1 and (r.identical or r.psnr_db.single) for r in self.rows)

    @property
    def mean_db(self) -> float | None:
        """Computed from per-seed rows (none if any pair is identical: the mean is infinite);
        else the source's own stated mean, if any."""
        if self.per_seed:
            if any(r.identical for r in self.rows):
                return None
            return fmean(r.psnr_db.min for r in self.rows)
        stated = [r.stated_mean_db for r in self.rows if r.stated_mean_db is not None]
        return stated[0] if len(stated) == 1 else None

    @property
    def seeds(self) -> list[int]:
        return sorted({s for r in self.rows for s in r.seeds})

    @property
    def low_db(self) -> float | None:
        return min((r.psnr_db.min for r in self.rows if r.psnr_db), default=None)

    @property
    def high_db(self) -> float | None:
        return max((r.psnr_db.max for r in self.rows if r.psnr_db), default=None)

    @property
    def structure(self) -> str:
        structures = {r.structure for r in self.rows}
        return structures.pop() if len(structures) == 1 else "mixed"

    @property
    def comparator(self) -> str:
        return "/".join(sorted({r.comparator for r in self.rows}))

    @property
    def baseline(self) -> str:
        return "/".join(sorted({r.baseline_attempt for r in self.rows}))


def psnr_groups(attempts: list[LoadedAttempt]) -> list[PsnrGroup]:
    groups: dict[tuple[str, str, str], list[PsnrRow]] = {}
    for attempt in attempts:
        for row in attempt.psnr:
            groups.setdefault((attempt.id, row.flag_set, row.fixture), []).append(row)
    return [PsnrGroup(*key, tuple(rows)) for key, rows in groups.items()]


def common_init_oom(runs: list[ServeRun]) -> OomSignature | None:
    """The init OOM every failed run shares (same ask, same place), if they all share one."""
    ooms = [r.init.oom for r in runs if r.init.outcome == "oom"]
    if not ooms or len(ooms) != len(runs) or any(o is None for o in ooms):
        return None
    keys = {(o.requested, o.location) for o in ooms}
    return ooms[0] if len(keys) == 1 and ooms[0].requested else None


def target_ooms(views: list[ServeRunView], fixtures: FixtureSuite, target: int) -> list[tuple[str, Cell]]:
    """(flag set, cell) for every cell that OOMed at the target reference count with a signature."""
    return [(v.flag_set, c) for v in views for c in v.cells
            if c.oom is not None and c.outcome == "oom"
            and fixtures.get(c.fixture).reference_count == target]


@dataclass(frozen=True)
class ImageStructure:
    """The structure metrics of the images one flag set returned for one fixture, measured."""

    attempt: str
    flag_set: str
    fixture: str
    images: tuple[ImageMetrics, ...]

    @property
    def broken(self) -> int:
        return sum(m.verdict == "broken" for m in self.images)

    def spread(self, metric: str) -> Range:
        return Range.of(getattr(m, metric) for m in self.images)


def image_structures(attempts: list[LoadedAttempt]) -> list[ImageStructure]:
    """Per attempt, flag set and fixture, the metrics of every image the gate measured."""
    groups: dict[tuple[str, str, str], list[ImageMetrics]] = {}
    for attempt in attempts:
        for record in attempt.requests:
            if record.image is not None:
                key = (attempt.id, record.flag_set, record.fixture)
                groups.setdefault(key, []).append(record.image)
    return [ImageStructure(*key, tuple(images)) for key, images in groups.items()]


def written_decimals(value: float) -> int:
    """How many decimals a transcribed figure was written with (44.3 -> 1, 23522 -> 0)."""
    exponent = Decimal(repr(value)).normalize().as_tuple().exponent
    return max(0, -exponent)


def rounded_to(value: float, digits: int) -> Decimal:
    """The figure rounded half up to `digits` decimals, as a person rounds when transcribing."""
    return Decimal(repr(value)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)


def agrees_at_stated_precision(stated: Range, detail: Range) -> bool:
    """A stated figure agrees with the detail when, at the precision it is written with, it lies
    inside the detail's range: 44.3 and 44.1–44.4 agree with 44.06–44.35; 34.1 does not agree
    with 34.62–35.05."""
    digits = max(written_decimals(stated.min), written_decimals(stated.max))
    low, high = rounded_to(detail.min, digits), rounded_to(detail.max, digits)
    return low <= Decimal(repr(stated.min)) and Decimal(repr(stated.max)) <= high


@dataclass(frozen=True)
class StatedDisagreement:
    """A figure the source states for a cell that its own per-fixture detail contradicts."""

    fixture: str
    where: str
    figure: str
    stated: Range
    detail: Range


STATED_FIGURES = ("wall_s", "server_peak_mb")


def stated_disagreements(cells) -> list[StatedDisagreement]:
    """Only the real disagreements: stated figures outside the detail at their own precision."""
    found = []
    for cell in cells:
        for stated in cell.stated:
            for figure in STATED_FIGURES:
                value, detail = getattr(stated, figure), getattr(cell, figure)
                if value is not None and detail is not None and not agrees_at_stated_precision(value, detail):
                    found.append(StatedDisagreement(cell.fixture, stated.where, figure, value, detail))
    return found
