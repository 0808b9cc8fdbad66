"""requests.json's format: one served request's record, the measurement every engine's record
shares, and the invariants a record must agree with itself on."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_serializer, model_validator

from omniprobe.config.fixtures import Inputs, Seed
from omniprobe.config.inside_path import InsidePath
from omniprobe.evidence.models.common import (
    EmulationBreach,
    EvidenceModel,
    FailureCause,
    OomSignature,
    Outcome,
    Sha256,
    StructureVerdict,
    Wall,
    Weights,
)


class ImageMetrics(EvidenceModel):
    mode: str
    width: int
    height: int
    opaque_fraction: float = Field(ge=0, le=1)
    alpha_mean: float
    rgb_mean: float
    rgb_std: float
    flatness: float
    verdict: Literal["sound", "broken"]
    reasons: list[str] = Field(default=[], description="Why the verdict is broken; empty if sound.")


# Each invariant is a small function of one record (a Measurement: serve or offline); a
# record shape that needs another rule adds its function to RECORD_INVARIANTS. A message starts
# with the field it is about, since the error's path names only the record.


def ok_names_its_image(record) -> None:
    """An ok record returned an image: its artifact and digest say which."""
    if record.outcome == "ok":
        missing = [f for f in ("artifact", "output_sha256") if getattr(record, f) is None]
        if missing:
            raise ValueError(f"{' and '.join(missing)}: required: an ok record names the image "
                             "it returned (its file and sha256)")


def structure_is_its_image_check(record) -> None:
    """'sound' or 'broken' is the verdict of the record's own image check."""
    if record.structure == "unchecked":
        return
    if record.outcome != "ok":
        raise ValueError(f"structure: {record.structure!r} judges an image, and a {record.outcome!r} "
                         "record returned none; expected 'unchecked'")
    if record.image is None:
        raise ValueError(f"structure: {record.structure!r} needs the image check it comes from "
                         "(image), which the record lacks")
    if record.image.verdict != record.structure:
        raise ValueError(f"structure: {record.structure!r} disagrees with the record's image check "
                         f"(image.verdict {record.image.verdict!r})")


def oom_states_its_signature(record) -> None:
    """An OOM holds the signature parsed from its message, or the message none was parsed from;
    any other outcome holds none."""
    if record.outcome == "oom" and record.oom is None and not record.error:
        raise ValueError("oom: required: an 'oom' record holds its OOM signature or, where none "
                         "was found, the error text it came with (error)")
    if record.outcome != "oom" and record.oom is not None:
        raise ValueError(f"oom: a {record.outcome!r} record holds no OOM signature")


RECORD_INVARIANTS = (ok_names_its_image, structure_is_its_image_check, oom_states_its_signature)


def record_invariants(record):
    for invariant in RECORD_INVARIANTS:
        invariant(record)
    return record


class Measurement(EvidenceModel):
    """What every engine's request record holds (serve, offline Omni, Diffusers): one fixture and
    seed, its outcome, its image's hashes and structure, its OOM and its cause."""

    fixture: str
    seed: Seed
    outcome: Outcome
    structure: StructureVerdict
    wall_s: Wall
    output_sha256: Sha256 | None = None
    pixels_sha256: Sha256 | None = Field(default=None, description="imaging.pixels_sha256.")
    artifact: InsidePath | None = Field(
        default=None, description="Image path outside git, relative to the artifacts folder.")
    image: ImageMetrics | None = None
    structure_note: str | None = Field(
        default=None, description="Why structure is unchecked for an image that came back (random "
                                  "weights: the structure gate is not applied).")
    oom: OomSignature | None = None
    error: str | None = None
    cause: FailureCause | None = Field(
        default=None, description="Why it failed; null: ok, or not classified (an OOM is the "
                                  "card's all the same).")
    started_s: float | None = Field(
        default=None, ge=0, description="When it began, seconds since its server or runner "
                                        "started.")
    lifetime: int | None = Field(
        default=None, ge=0, description="Index of its server (runner process) in the run's "
                                        "lifetimes.")
    inputs: Inputs = Field(
        default="original", description="The fixture's own inputs, or omniprobe's stand-ins for "
                                        "inputs the source does not state (fixtures.json).")
    weights: Weights | None = Field(
        default=None, description="random: made with random weights, capacity only; null: the "
                                  "model's own weights.")
    emulation_breach: EmulationBreach | None = Field(
        default=None, description="Emulated hosts: the process tree exceeded the cap by the time "
                                  "this request ended; it never counts as a fit.")

    @model_validator(mode="after")
    def _random_weights_capacity_only(self):
        if self.weights == "random" and (self.structure != "unchecked" or self.image is not None):
            raise ValueError("a random-weight record claims no output structure: structure must be "
                             "'unchecked' and image absent (random weights count for capacity "
                             "only)")
        return self

    @model_validator(mode="after")
    def _consistent(self):
        return record_invariants(self)


class RequestRecord(Measurement):
    """One request as the package measured it."""

    flag_set: str
    server_peak_mb: float | None = Field(default=None, ge=0)
    denoise_step_latency_ms: float | None = Field(default=None, ge=0)
    transport_failure: bool = Field(
        default=False, description="true: no answer came (connection refused or dropped, the "
                                   "server gone), so nothing about the model was measured; a "
                                   "resume sends the request again and records that after it. "
                                   "Written only when true.")

    def settles(self, accept_timeouts: bool) -> bool:
        """Whether this record settles its cell for a run: a lost request never does; a timeout,
        no answer of the card's, only for a run that accepts timeouts."""
        return not self.transport_failure and (accept_timeouts or self.outcome != "timeout")

    @property
    def sent_again_on_resume(self) -> bool:
        """No answer of the card's (a lost request, a timeout): a later record of its cell
        supersedes it."""
        return not self.settles(accept_timeouts=False)

    @model_serializer(mode="wrap")
    def _transport_failure_only_when_true(self, handler):
        """A request that was answered says nothing of transport: its file stays as it was when
        the field was optional (absent, never false)."""
        data = handler(self)
        if not self.transport_failure:
            data.pop("transport_failure", None)
        return data
