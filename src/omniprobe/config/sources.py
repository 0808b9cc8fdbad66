"""A source document: named by its file name and sha256, never by a path. The document itself
stays outside the repository (a clone does not have it); its digest says which one it is."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from omniprobe.config.strict import STRICT

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class SourceDocument(BaseModel):
    model_config = STRICT

    name: str = Field(pattern=r"^[^/\\]+$", description="The document's file name, no folder.")
    sha256: Sha256 | None = Field(
        default=None, description="The sha256 of the document's bytes; null: not recorded "
                                  "(evidence of format version 2 named a path only).")

    def cite(self) -> str:
        """How the report and messages name it."""
        digest = f"sha256 {self.sha256[:16]}…" if self.sha256 else "sha256 not recorded"
        return f"{self.name} ({digest})"
