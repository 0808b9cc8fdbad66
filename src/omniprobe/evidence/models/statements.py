"""The formats of what the source states: code read, findings, corrections, stated figures."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from omniprobe.evidence.models.common import CodeRef, EvidenceModel
from omniprobe.evidence.quantities import Range


class CodeLocation(EvidenceModel):
    """A fact read off the upstream code, with where it was read when the source says."""

    key: str
    ref: CodeRef | None = None
    what: str
    label: str | None = Field(default=None, description="What the report calls it, in words.")


class Finding(EvidenceModel):
    """A conclusion the source states, placed where the source puts it."""

    key: str = Field(pattern=r"^[a-z0-9_]+$")
    statement: str
    placement: Literal["verdict", "ceiling", "structure", "speed", "follow-through"] = Field(
        description="Where the report states it: the verdict; the usable ceiling's opening line (a "
                    "qualification of it); the output-structure section; the line of the speed-up "
                    "of a broken flag set; the follow-through.")
    section: str = Field(description="The source's section it comes from.")


class Correction(EvidenceModel):
    subject: str
    claimed: str
    finding: str
    artifacts: list[str] = []
    opaque_fraction: float | None = None
    stands: str | None = Field(default=None, description="What of the corrected claim stands.")
    stands_figure: str | None = Field(default=None, description="The key of the stated figure it gives.")
    falls: str | None = Field(default=None, description="What of it does not stand.")


class StatedFigure(EvidenceModel):
    """A figure the source states as its own estimate or citation, kept apart from measurements."""

    key: str = Field(pattern=r"^[a-z0-9_]+$")
    value: float | None = None
    range: Range | None = None
    unit: str
    approximate: bool = Field(default=False, description="The seed writes it as approximate (~, ≈, roughly).")
    statement: str
    label: str | None = Field(default=None, description="What the report calls it, in words.")
