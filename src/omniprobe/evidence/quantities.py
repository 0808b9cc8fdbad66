"""Ranges and byte sizes as the seed report and PyTorch write them."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, model_validator

from omniprobe.config.strict import STRICT

_UNITS = {
    "B": 1,
    "bytes": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}
_SIZE = re.compile(r"^(?P<num>\d+(?:\.\d+)?) ?(?P<unit>bytes|B|KiB|MiB|GiB|TiB)$")


def size_bytes(text: str) -> int:
    """Bytes in a size written like PyTorch does: '490.00 MiB', '0 bytes', '21.02 GiB'."""
    match = _SIZE.match(text.strip())
    if not match:
        raise ValueError(f"expected a size such as '490.00 MiB' or '0 bytes', got {text!r}")
    return round(float(match["num"]) * _UNITS[match["unit"]])


def size_mib(text: str) -> float:
    return size_bytes(text) / 1024**2


def _check_size(text: str) -> str:
    size_bytes(text)
    return text


# A size kept exactly as the source wrote it, so a transcription renders back unchanged.
Size = Annotated[str, AfterValidator(_check_size)]


class Range(BaseModel):
    """A closed interval; a single observation has min == max."""

    model_config = STRICT

    min: float
    max: float

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.min > self.max:
            raise ValueError(f"minimum {self.min} exceeds maximum {self.max}")
        return self

    @classmethod
    def of(cls, values) -> Range:
        values = list(values)
        if not values:
            raise ValueError("a range needs at least one value")
        return cls(min=min(values), max=max(values))

    @property
    def mid(self) -> float:
        return (self.min + self.max) / 2

    @property
    def single(self) -> bool:
        return self.min == self.max
