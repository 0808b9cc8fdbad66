"""Cells from request records: what the verdict rules read for attempts the package measured."""

from __future__ import annotations

from .evidence import Cell, Outcome, Quality, RequestRecord
from .quantities import Range

# The cell takes its worst request: one OOM among ok seeds still means the count does not fit.
_OUTCOME_ORDER: tuple[Outcome, ...] = ("oom", "error", "timeout", "ok")


def cell_outcome(outcomes: list[Outcome]) -> Outcome:
    return next(o for o in _OUTCOME_ORDER if o in outcomes)


def cell_quality(records: list[RequestRecord]) -> Quality:
    """Sound only when every request returned a sound image; broken when any image was broken."""
    qualities = {r.quality for r in records}
    if "broken" in qualities:
        return "broken"
    if qualities == {"sound"} and all(r.outcome == "ok" for r in records):
        return "sound"
    return "unchecked"


def _range(values: list[float | None]) -> Range | None:
    present = [v for v in values if v is not None]
    return Range.of(present) if present else None


def cell_from(records: list[RequestRecord]) -> Cell:
    """One fixture under one flag set; wall and peak ranges are over the requests that succeeded."""
    ok = [r for r in records if r.outcome == "ok"]
    oom = next((r.oom for r in records if r.oom is not None), None)
    return Cell(fixture=records[0].fixture, seeds=sorted({r.seed for r in records}),
                outcome=cell_outcome([r.outcome for r in records]),
                quality=cell_quality(records),
                wall_s=_range([r.wall_s for r in ok]),
                server_peak_mb=_range([r.server_peak_mb for r in ok]),
                oom=oom)


def cells_from_requests(requests: list[RequestRecord]) -> dict[str, list[Cell]]:
    """flag set -> its cells, in the order the fixtures were first requested."""
    grouped: dict[str, dict[str, list[RequestRecord]]] = {}
    for record in requests:
        grouped.setdefault(record.flag_set, {}).setdefault(record.fixture, []).append(record)
    return {flag_set: [cell_from(records) for records in fixtures.values()]
            for flag_set, fixtures in grouped.items()}
