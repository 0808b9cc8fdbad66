"""The report's table of what each setting buys (analysis/knob_deltas.py): per profile one setting
away from its searched base, the pool saved at each count and the time it costs, as ratios."""

from __future__ import annotations

import json
from dataclasses import dataclass

from omniprobe.analysis.capacity_bands import Searched
from omniprobe.analysis.knob_deltas import KnobDelta, TimeCost, knob_deltas


@dataclass(frozen=True)
class KnobRow:
    setting: str  # `knob` = value
    profile: str
    base: str
    saved: list[str]  # by reference count: MiB saved, ± both bands' widths
    time: str


def saved_cell(saved_mib: int, within_mib: int) -> str:
    return f"{saved_mib:,} ± {within_mib:,}"


def ratio_words(cost: TimeCost | None) -> str:
    if cost is None:
        return "not timed on both"
    parts = [f"{what} ×{ratio:.2f}" for what, ratio in (
        ("a step after the first", cost.step_ratio), ("the decode", cost.decode_ratio),
        ("the request", cost.wall_ratio)) if ratio is not None]
    return (", ".join(parts) + f" ({cost.reference_count} ref"
            f"{'' if cost.reference_count == 1 else 's'}, {cost.steps} steps)")


def knob_row(delta: KnobDelta, counts: list[int]) -> KnobRow:
    by_count = {p.reference_count: p for p in delta.pool}
    return KnobRow(f"`{delta.knob}` = {json.dumps(delta.value)}", delta.profile, delta.base,
                   [saved_cell(by_count[n].saved_mib, by_count[n].within_mib)
                    if n in by_count else "—" for n in counts],
                   ratio_words(delta.time))


def knob_rows(searches: dict[str, Searched], bases: dict[str, str | None],
              counts: list[int]) -> list[KnobRow]:
    return [knob_row(d, counts) for d in knob_deltas(searches, bases)]
