"""capacity.json's and capacity-trials.json's formats: the capacity search of a Diffusers host,
per profile and reference count the smallest memory pool it fits in, as a band, and every trial
that found it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, JsonValue, model_validator

from omniprobe.config.fixtures import Inputs
from omniprobe.evidence.models.common import (
    ArtifactRef,
    EvidenceModel,
    FailureCause,
    OomSignature,
    PeakSource,
)
from omniprobe.evidence.models.offline import (
    DiffusersBuild,
    HostRamCheck,
    host_end_within_peak,
    measure,
)
from omniprobe.evidence.models.runs import TimelineSummary
from omniprobe.limits import MAX_MIB


class CapacityTrial(EvidenceModel):
    """One request under one pool limit: torch's pool may reserve `limit_mib` and no more."""

    profile: str
    reference_count: int = Field(ge=0)
    fixture: str
    inputs: Inputs
    limit_mib: int = Field(gt=0, le=MAX_MIB)
    outcome: Literal["fit", "oom", "error"]
    phase: Literal["bracket", "bisect", "confirm"]
    repeat: bool = Field(description="A repeat at a limit this count already tried.")
    wall_s: float = Field(ge=0)
    started_s: float | None = Field(default=None, ge=0,
                                    description="Seconds from the runner's start.")
    peak_mib: float | None = Field(default=None, ge=0,
                                   description="torch's reserved peak over the trial.")
    peak_source: PeakSource | None = None
    peak_allocated_mib: float | None = Field(default=None, ge=0)
    process_mib: float | None = Field(
        default=None, ge=0, description="NVML's figure for the runner at the trial's end.")
    outside_pool_mib: float | None = Field(
        default=None, ge=0, description="process_mib less torch's reserved pool at the same "
        "moment: the CUDA context, kernels loaded as they run, other libraries' allocations. The "
        "measuring machine's, not the card's.")
    mem_get_info_total_mib: int | None = Field(
        default=None, gt=0, description="What torch.cuda.mem_get_info reported as the total "
                                        "during the trial (the limit); null: not patched (no CUDA).")
    kv_cache_bytes: int | None = Field(default=None, ge=0)
    kv_cache_host_bytes: int | None = Field(default=None, ge=0, description="Of kv_cache_bytes, "
                                            "those held in host memory (kv_placement).")
    # The runner's start and host figures (omniprobe_engine/protocol.py TRIAL_CARRIES); null in
    # trials recorded before they were carried.
    start_allocated_mib: float | None = measure("start_allocated_mib")
    start_reserved_mib: float | None = measure("start_reserved_mib")
    max_rss_mib: float | None = measure("max_rss_mib")
    host_peak_mib: float | None = measure("host_peak_mib")
    host_end_mib: float | None = measure("host_end_mib")
    pinned_host_peak_mib: float | None = measure("pinned_host_peak_mib")
    pinned_host_start_mib: float | None = measure("pinned_host_start_mib")
    first_step_end_s: float | None = measure("first_step_end_s")
    step_after_first_s: float | None = measure("step_after_first_s")
    decode_s: float | None = measure("decode_s")
    oom: OomSignature | None = None
    error: str | None = None
    cause: FailureCause | None = None
    lifetime: int = Field(ge=0, description="Which runner process ran it (0-based).")
    set_aside: str | None = Field(
        default=None, description="Why the trial does not count toward its band (it started with "
                                  "more held than the build left, or errored right after a "
                                  "failure): recorded, never handed to the search; null: it "
                                  "counts.")

    @property
    def counts(self) -> bool:
        return self.set_aside is None

    @property
    def start_recorded(self) -> bool:
        """Trials recorded before their start figures were carried say nothing of how they
        started (read as before, and said so)."""
        return self.start_allocated_mib is not None

    _host_peak_holds_its_end = model_validator(mode="after")(host_end_within_peak)

    @model_validator(mode="after")
    def _oom_has_its_signature(self):
        if self.outcome == "fit" and (self.oom is not None or self.error is not None):
            raise ValueError("a trial that fit carries no OOM or error")
        return self


class TimedRequest(EvidenceModel):
    """A search's timed request (probe-capacity --speed-steps): after the bands, one request at
    its own steps at one count, the pool at `limit_mib`; its seconds are the measuring GPU's,
    read at each denoising step's end."""

    reference_count: int = Field(ge=0)
    fixture: str
    num_inference_steps: int = Field(ge=1)
    limit_mib: int = Field(gt=0, le=MAX_MIB)
    outcome: Literal["fit", "oom", "error"]
    wall_s: float = Field(ge=0, description="The request's wall, the references' files read "
                                            "and the image written included.")
    peak_mib: float | None = Field(default=None, ge=0)
    peak_allocated_mib: float | None = Field(default=None, ge=0)
    start_allocated_mib: float | None = measure("start_allocated_mib")
    first_step_end_s: float | None = measure("first_step_end_s")
    step_after_first_s: float | None = measure("step_after_first_s")
    decode_s: float | None = measure("decode_s")
    kv_cache_bytes: int | None = Field(default=None, ge=0)
    kv_cache_host_bytes: int | None = Field(default=None, ge=0)
    pinned_host_peak_mib: float | None = measure("pinned_host_peak_mib")
    pinned_host_start_mib: float | None = measure("pinned_host_start_mib")
    host_peak_mib: float | None = measure("host_peak_mib")
    error: str | None = None
    lifetime: int = Field(ge=0, description="Which runner process ran it (0-based).")

    @model_validator(mode="after")
    def _a_fit_has_no_error(self):
        if self.outcome == "fit" and self.error is not None:
            raise ValueError("a timed request that fit carries no error")
        return self


class CapacityBand(EvidenceModel):
    """One profile and reference count: it fit at every trial at or above `fits_at_mib` (A) and
    failed at every trial at or below `fails_at_mib` (B); between them it is uncertain."""

    reference_count: int = Field(ge=0)
    fixture: str
    fits_at_mib: int | None = Field(default=None, gt=0, description="A; null: nothing up to the "
                                                                     "ceiling fit reliably.")
    fails_at_mib: int | None = Field(default=None, gt=0, description="B; null: nothing down to "
                                                                      "the floor failed.")
    fails_at_inferred: bool = Field(
        default=False, description="B was not tried at this count: it is the previous count's "
                                   "B (more references never need less).")
    trials: int = Field(ge=0, description="Trials this count ran to find its band.")
    requests_saved: int = Field(
        description="Trials the previous counts' bands saved, against a search from the floor "
                    "and ceiling alone (both counted on this band's boundary without noise).")
    stopped: Literal["error"] | None = Field(
        default=None, description="Why no band was found: a trial ended in an error.")

    @property
    def width_mib(self) -> int | None:
        """A less B: how far apart the band's edges lie; None where either was not found."""
        if self.fits_at_mib is None or self.fails_at_mib is None:
            return None
        return self.fits_at_mib - self.fails_at_mib

    def disagreements(self, counted: list[CapacityTrial]) -> list[str]:
        """How the band disagrees with its count's counted trials: A is a fit seen at A and
        nothing at or above it failed; B a failure seen at B (unless it was the neighbour's,
        inferred before bands were earned at their count) and nothing at or below it fit."""
        if self.stopped:
            return []
        found = []
        if self.fits_at_mib is not None:
            if not any(t.outcome == "fit" and t.limit_mib == self.fits_at_mib for t in counted):
                found.append(f"fits_at_mib {self.fits_at_mib}: no counted trial fit there")
            found += [f"fits_at_mib {self.fits_at_mib}: a counted trial at {t.limit_mib} MiB "
                      f"ended {t.outcome}" for t in counted
                      if t.limit_mib >= self.fits_at_mib and t.outcome != "fit"]
        if self.fails_at_mib is not None:
            if not self.fails_at_inferred and not any(
                    t.outcome != "fit" and t.limit_mib == self.fails_at_mib for t in counted):
                found.append(f"fails_at_mib {self.fails_at_mib}: no counted trial failed there")
            found += [f"fails_at_mib {self.fails_at_mib}: a counted trial at {t.limit_mib} MiB "
                      "fit" for t in counted
                      if t.limit_mib <= self.fails_at_mib and t.outcome == "fit"]
        return found

    @model_validator(mode="after")
    def _a_above_b(self):
        if (self.fits_at_mib is not None and self.fails_at_mib is not None
                and self.fits_at_mib <= self.fails_at_mib):
            raise ValueError(f"fits_at_mib {self.fits_at_mib} must lie above fails_at_mib "
                             f"{self.fails_at_mib}")
        return self


# The flags that give a search's grid (harness/common/options.py FLOOR, CEILING, RESOLUTION,
# REPEATS; a test holds the two together).
GRID_FLAGS = ("--floor-mib", "--ceiling-mib", "--resolution-mib", "--repeats")


def given_grid_flags(command: list[str]) -> set[str]:
    """The grid flags `command` names (as `--flag V`, `--flag=V`, or a prefix argparse took for
    it: a recorded command parsed, so a prefix it holds named one option)."""
    given = set()
    for token in command:
        flag = token.split("=", 1)[0]
        if len(flag) > 2 and flag.startswith("--"):
            given.update(g for g in GRID_FLAGS if g.startswith(flag))
    return given


def grid_chooser(command: list[str]) -> Literal["omniprobe", "command line"]:
    """Who chose the grid of a search that `command` ran: the command line where it names a grid
    flag, else omniprobe's defaults."""
    return "command line" if given_grid_flags(command) else "omniprobe"


class SearchSettings(EvidenceModel):
    floor_mib: int = Field(gt=0, le=MAX_MIB)
    ceiling_mib: int = Field(gt=0, le=MAX_MIB)
    resolution_mib: int = Field(gt=0, le=MAX_MIB)
    repeats: int = Field(ge=0, description="Trials beyond the first at each side of a band.")
    rule: int = Field(default=1, ge=1, description="The version of the search's rule it ran "
                                                   "(omniprobe_engine/search.py RULE_VERSION); "
                                                   "a search recorded before it said ran 1.")
    chosen_by: Literal["omniprobe", "command line"] = Field(
        default="omniprobe", description="Who chose the grid: the attempt's command line named "
                                         "a grid flag (grid_chooser), or not.")

    def differences(self, now: SearchSettings) -> list[str]:
        """Each setting that differs from `now`, as `key: recorded -> now` (who chose them
        aside: the same grid is the same search)."""
        return [f"search {key}: {getattr(self, key)!r} -> {getattr(now, key)!r}"
                for key in type(self).model_fields
                if key != "chosen_by" and getattr(self, key) != getattr(now, key)]

    @model_validator(mode="after")
    def _a_grid(self):
        if not self.floor_mib < self.ceiling_mib:
            raise ValueError("floor_mib must lie below ceiling_mib")
        if self.resolution_mib > self.ceiling_mib - self.floor_mib:
            raise ValueError("resolution_mib must be at most the span")
        return self


class ProfileSearch(EvidenceModel):
    """One profile's search in one runner: what it ran, under which settings, and its bands."""

    def done(self, counts: set[int], speed_steps: int) -> bool:
        """Nothing left to run for `counts` and a timed request at `speed_steps` (0: none): its
        build failed, or it has every band and that request."""
        return self.init_outcome != "ready" or (
            {b.reference_count for b in self.bands} >= counts
            and (not speed_steps or any(t.num_inference_steps == speed_steps
                                        for t in self.timed)))

    profile: str
    settings: dict[str, JsonValue] = Field(
        description="The profile's settings in full, as hosts.toml held them when it ran.")
    search: SearchSettings
    num_inference_steps: int = Field(ge=1)
    true_cfg_scale: float
    seed: int = Field(ge=0)
    sizes: dict[str, str] = Field(description="Fixture -> its width×height.")
    bands: list[CapacityBand] = []
    gpu_s: float | None = Field(default=None, ge=0, description="The runners' wall from each "
                                "one's start to its last event (a band, its end), the builds "
                                "included: the curve's cost.")
    build: DiffusersBuild | None = None
    logs: list[ArtifactRef] = []
    timelines: list[TimelineSummary] = []
    host_ram: list[HostRamCheck] = []
    init_outcome: Literal["ready", "init-oom", "init-error", "timeout"] = "ready"
    note: str | None = None
    timed: list[TimedRequest] = Field(
        default=[], description="Its timed requests (--speed-steps), one per step count asked.")
    restarts: list[str] = Field(
        default=[], description="Why each runner after the first took the search up: the one "
                                "before closed (its engine did not recover from a failure, or "
                                "an error followed one). Each runner's log, timeline and host "
                                "RAM are kept in order.")
