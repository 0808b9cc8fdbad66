"""The formats of what the outputs show: structure, PSNR, determinism, propagation, the baseline."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from omniprobe.evidence.models.common import EvidenceModel, Sha256Prefix, StructureVerdict
from omniprobe.evidence.quantities import Range


class StructureObservation(EvidenceModel):
    """Output-structure figures of a set of images, as measured or stated."""

    scope: str
    flag_set: str | None = None
    kwarg_set: str | None = None
    fixtures: list[str] = []
    opaque_fraction: Range | None = None
    transparent_fraction: Range | None = None
    alpha_mean: Range | None = None
    rgb_mean: Range | None = None
    psnr_db: Range | None = None
    approximate: bool = Field(default=False, description="The seed gives the alpha and RGB means as "
                                                          "approximate (~, ≈).")
    structure: StructureVerdict
    note: str | None = None


class PsnrRow(EvidenceModel):
    flag_set: str
    fixture: str
    seeds: list[int] = Field(min_length=1)
    psnr_db: Range | None = Field(default=None, description="Absent only when identical.")
    identical: bool = Field(default=False, description="Pixel-identical: PSNR is infinite.")
    stated_mean_db: float | None = Field(
        default=None, description="Only where per-seed values are not given."
    )
    comparator: Literal["rgba", "rgb"]
    baseline_attempt: str
    structure: StructureVerdict
    note: str | None = None

    @model_validator(mode="after")
    def _psnr_unless_identical(self) -> PsnrRow:
        if (self.psnr_db is None) != self.identical:
            raise ValueError("psnr_db is required, and only absent when identical is true")
        return self


class DeterminismGroup(EvidenceModel):
    fixture: str
    seed: int
    flag_sets: list[str] = Field(min_length=2)
    sha256_prefix: Sha256Prefix
    compared: Literal["bytes", "pixels"]
    identical: bool


class PropagationCheck(EvidenceModel):
    knob: str
    flag_set_with: str
    flag_set_without: str
    via: Literal["serve", "offline"] = Field(
        default="serve", description="serve: the two are flag sets served by `vllm serve`; "
                                     "offline: they are offline kwarg sets of `Omni(...)` engines.")
    # A default, because files are written without nulls: an unmeasured check must load back.
    bytes_identical: bool | None = None
    pixels_identical: bool | None = None
    shapes_tried: list[str] = []
    offline_kwarg_accepted: bool | None = None
    dropped_at: str | None = Field(default=None, description="Where the knob is lost, if known.")
    note: str | None = None
    fixture: str | None = Field(default=None, description="Probed checks: the fixture served.")
    seed: int | None = Field(default=None, description="Probed checks: the seed served.")
    deploy_config_ignored: bool | None = Field(
        default=None, description="Probed serve checks: whether the with-server's log says "
                                  "upstream ignored the deploy config; null: not read.")

    @property
    def reached_model(self) -> bool | None:
        if self.deploy_config_ignored:
            return False  # upstream said so: whatever the outputs, the config never reached it
        if self.bytes_identical is None and self.pixels_identical is None:
            return None
        return not (self.bytes_identical or self.pixels_identical)


class BaselineWall(EvidenceModel):
    fixture: str
    wall_s: float = Field(gt=0)


class Baseline(EvidenceModel):
    attempt_id: str
    profile: str
    engine: str
    dit: str
    kv_cache: bool
    walls: list[BaselineWall]
    note: str | None = None
