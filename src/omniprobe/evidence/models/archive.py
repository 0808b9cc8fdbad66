"""The manifest of an evidence archive (`omniprobe evidence pack`): the sha256 of every other
member, by its path in the archive."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from omniprobe.config.strict import STRICT
from omniprobe.evidence.models.common import Sha256

ARCHIVE_FORMAT = 1


class ArchiveManifest(BaseModel):
    model_config = STRICT

    format: Literal[1] = Field(description="The archive layout's version.")
    files: dict[str, Sha256] = Field(description="Every other member of the archive, by path: "
                                     "its sha256.")


class JournalledMove(BaseModel):
    model_config = STRICT

    staged: str = Field(description="The staged folder, an absolute path.")
    target: str = Field(description="Its place in evidence/ or artifacts/, an absolute path.")
    replaced: str | None = Field(
        default=None, description="Where the folder at the target is set aside before the move "
                                  "(an attempt the archive only adds to); null: the target must "
                                  "not exist.")


class UnpackJournal(BaseModel):
    """The moves an unpack makes once everything is staged and validated, written before the
    first: after an interrupt, the next `omniprobe evidence` command completes them."""

    model_config = STRICT

    moves: list[JournalledMove]
