"""The conditioning KV cache's derived figures: what Diffusers' own byte count gives per prefix
token and per reference, and how a figure of one engine stands against another's.

A ratio across engines is never a check: the seed's figures are vLLM-Omni's, estimated from
server-peak deltas, and the bytes here are Diffusers' own cache counted tensor by tensor; a ratio
says how far apart they are, not which is right.
"""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe.analysis.diffusers_capacity import KvMeasure, KvPerReference
from omniprobe.evidence.quantities import Range


@dataclass(frozen=True)
class KvBySize:
    """Every complete cache of one condition size: bytes per prefix token over all of them, and
    the references' share per reference over those that count their prompt's tokens."""

    output_resolution: int
    requests: int
    bytes_per_token: Range
    tokens_per_reference: Range | None  # None: no record counts its prompt's tokens
    bytes_per_reference: Range | None


def kv_by_size(measures: list[KvMeasure], shares: list[KvPerReference]) -> list[KvBySize]:
    out = []
    for size in sorted({m.output_resolution for m in measures}):
        mine = [m for m in measures if m.output_resolution == size]
        share = [s for s in shares if s.output_resolution == size]
        out.append(KvBySize(
            size, len(mine), Range.of(m.bytes_per_token for m in mine),
            Range.of(s.tokens_per_reference for s in share) if share else None,
            Range.of(s.bytes_per_reference for s in share) if share else None))
    return out


@dataclass(frozen=True)
class CrossRatio:
    """`measured` over `stated`, as a range: its least over the stated figure's most, and its
    most over the stated figure's least. None where the two overlap: then no ratio is meaningful."""

    measured: Range
    stated: Range
    ratio: Range | None

    @property
    def overlaps(self) -> bool:
        return self.ratio is None


def cross_ratio(measured: Range, stated: Range) -> CrossRatio:
    if measured.max >= stated.min and measured.min <= stated.max:
        return CrossRatio(measured, stated, None)
    return CrossRatio(measured, stated, Range(min=measured.min / stated.max,
                                              max=measured.max / stated.min))
