"""A cell's outcome and structure from its requests: the worst request decides."""

from __future__ import annotations

from omniprobe.evidence.models.common import Outcome, StructureVerdict
from omniprobe.evidence.models.requests import RequestRecord

# The cell takes its worst request: one OOM among ok seeds still means the count does not fit.
_OUTCOME_ORDER: tuple[Outcome, ...] = ("oom", "error", "timeout", "ok")


def cell_outcome(outcomes: list[Outcome]) -> Outcome:
    return next(o for o in _OUTCOME_ORDER if o in outcomes)


def cell_structure(records: list[RequestRecord]) -> StructureVerdict:
    """Sound only when every request returned a sound image; broken when any image was broken."""
    structures = {r.structure for r in records}
    if "broken" in structures:
        return "broken"
    if structures == {"sound"} and all(r.outcome == "ok" for r in records):
        return "sound"
    return "unchecked"
