"""offline.json's and offline-requests.json's formats: an offline engine's run (its init, cells,
runner lifetimes, build and settings) and its requests."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, JsonValue, model_validator

from omniprobe.evidence.models.common import (
    ArtifactRef,
    EvidenceModel,
    OomSignature,
    Outcome,
    PeakSource,
    StructureVerdict,
)
from omniprobe.evidence.models.requests import Measurement
from omniprobe.evidence.models.runs import InitResult, TimelineSummary
from omniprobe.evidence.quantities import Range


class Configured(EvidenceModel):
    """A record of an offline engine names its configuration by what it is: an Omni engine's
    offline kwarg set (`kwarg_set`), or the Diffusers engine's profile (`profile`), one of them."""

    kwarg_set: str | None = Field(default=None, description="The Omni engine's offline kwarg set.")
    profile: str | None = Field(default=None, description="The Diffusers engine's profile.")

    @model_validator(mode="after")
    def _one_configuration(self):
        if (self.kwarg_set is None) == (self.profile is None):
            raise ValueError("name exactly one of kwarg_set (an Omni engine's) and profile (the "
                             "Diffusers engine's)")
        return self

    @property
    def configuration(self) -> str:
        """The kwarg set's or the profile's name."""
        return self.profile if self.profile is not None else self.kwarg_set


class OfflineCell(EvidenceModel):
    """One fixture of an offline run: the summary of its requests."""

    fixture: str | None = Field(default=None, description="null: a transcribed run whose source "
                                                          "names no fixture.")
    seeds: list[int] | None = None
    outcome: Outcome
    structure: StructureVerdict
    oom: OomSignature | None = None
    note: str | None = None
    wall_s: Range | None = Field(default=None, description="Probed runs: walls of the ok requests.")


class RunnerLifetime(EvidenceModel):
    """One runner process of an offline run, as the probe ran it: its log, its GPU memory series
    and, emulated, the host RAM it was held to."""

    log: ArtifactRef | None = None
    timeline: TimelineSummary | None = None
    host_ram: HostRamCheck | None = Field(
        default=None, description="Emulated host RAM; null: host RAM was not emulated (the "
                                  "machine's own held what offload moved).")
    closed: str | None = Field(
        default=None, description="Why the runner closed before its requests were done, beyond "
                                  "an engine closing on a failure as upstream's does (its "
                                  "recovery did not bring it back to the build's state: the "
                                  "requests left went to a fresh runner); null: it was not.")


# An init that failed, as a capacity search and the report name it (the serve run's InitResult
# outcome with its phase).
INIT_FAILED = {"oom": "init-oom", "error": "init-error", "timeout": "timeout"}


class OfflineRun(Configured):
    """One entry of the offline matrix as an attempt ran it: an Omni kwarg set's or a Diffusers
    profile's engine, its init (the latest runner's), its cells, its runner lifetimes, and for a
    Diffusers profile its build and the settings it ran under."""

    engine: Literal["omni", "diffusers"]
    init: InitResult | None = Field(
        default=None, description="The latest runner's init; null: none recorded (no runner got "
                                  "that far, or the source does not say).")
    cells: list[OfflineCell] = Field(default=[], description="One per fixture, in the order they ran.")
    lifetimes: list[RunnerLifetime] = Field(default=[], description="Probed runs: each runner "
                                                                    "process, the latest last.")
    build: DiffusersBuild | None = Field(default=None, description="Diffusers engines only.")
    settings: dict[str, JsonValue] | None = Field(
        default=None, description="A Diffusers profile's settings in full, as hosts.toml held "
        "them when its run began: what the attempt's records under that name ran, whatever "
        "hosts.toml says later; null: an Omni run, or one made before runs recorded them.")

    @model_validator(mode="after")
    def _named_by_engine(self):
        if (self.engine == "diffusers") != (self.profile is not None):
            raise ValueError("a Diffusers run names its profile, an Omni run its kwarg set")
        if self.engine != "diffusers" and (self.build is not None or self.settings is not None):
            raise ValueError("only a Diffusers run records a build and a profile's settings")
        return self

    @property
    def init_failed(self) -> str | None:
        """How its init failed (init-oom, init-error, timeout); None: ready or not recorded."""
        return INIT_FAILED.get(self.init.outcome) if self.init is not None else None

    @property
    def ran(self) -> bool:
        """It recorded an init or a cell (a run begun and never built records only settings)."""
        return self.init is not None or bool(self.cells)

    @property
    def timelines(self) -> list[TimelineSummary]:
        return [lt.timeline for lt in self.lifetimes if lt.timeline is not None]

    @property
    def host_ram(self) -> list[HostRamCheck]:
        return [lt.host_ram for lt in self.lifetimes if lt.host_ram is not None]


# The figures a request and a capacity trial both record of the runner, described once.
_MEASURE_TEXT = {
    "start_allocated_mib": "What torch held allocated when the request began.",
    "start_reserved_mib": "What torch held reserved when the request began, its cache emptied "
                          "(null: not recorded, or no CUDA).",
    "max_rss_mib": "The runner process's peak resident memory so far.",
    "host_peak_mib": "The runner's resident memory at its highest during this request, sampled "
                     "beside it (max_rss_mib and a cgroup's memory.peak are lifetime peaks, the "
                     "build's included).",
    "host_end_mib": "The runner's resident memory when the request ended.",
    "pinned_host_start_mib": "torch's pinned host allocator when the request began, the blocks it "
                             "kept cached from earlier requests given back first (null: not "
                             "recorded, or no CUDA): what the request's page-locked peak adds to.",
    "pinned_host_peak_mib": "torch's pinned host allocator at its highest during the request "
                            "(page-locked, its blocks rounded up to powers of two); null: no "
                            "CUDA, nothing pinned.",
    # Seconds, read at each denoising step's end with the GPU synchronized: the measuring GPU's.
    "first_step_end_s": "Seconds from the pipeline's call to its first denoising step's end: the "
                        "prompt and the references encoded, and step 0, which writes the "
                        "conditioning cache.",
    "step_after_first_s": "Seconds per denoising step after the first (reading the cache), their "
                          "mean; null: one step, or the request failed before its second.",
    "decode_s": "Seconds from the last denoising step's end to the image: the VAE decode.",
}


def measure(name: str) -> Any:
    """The field of one of the runner's figures (MiB or seconds as its name says, from 0; null:
    not measured)."""
    return Field(default=None, ge=0, description=_MEASURE_TEXT[name])


def host_end_within_peak(model: Any) -> Any:
    """A sampled host peak holds its last reading: the end is never above the peak."""
    if (model.host_peak_mib is not None and model.host_end_mib is not None
            and model.host_end_mib > model.host_peak_mib):
        raise ValueError(f"host_end_mib {model.host_end_mib} is above host_peak_mib "
                         f"{model.host_peak_mib}: the sampled peak holds its last reading")
    return model


class OfflineRequest(Measurement, Configured):
    """One fixture and seed generated by an offline engine (vLLM-Omni's `Omni(...)`, the sim's,
    or the Diffusers pipeline), as the package measured it: a serve RequestRecord's measurement,
    keyed by the kwarg set (the Diffusers engine's: the profile) instead of a flag set."""

    def settles(self, accept_timeouts: bool) -> bool:
        """Whether this record settles its cell for a run: a timeout, no answer of the card's,
        only for a run that accepts timeouts."""
        return accept_timeouts or self.outcome != "timeout"

    @property
    def sent_again_on_resume(self) -> bool:
        """A timeout: a later record of its cell supersedes it."""
        return not self.settles(accept_timeouts=False)

    engine: Literal["omni", "diffusers"] | None = Field(
        default=None, description="The runner's engine; null: omni (or a record made before "
                                  "records said).")

    @model_validator(mode="after")
    def _profile_iff_diffusers(self):
        if (self.engine == "diffusers") != (self.profile is not None):
            raise ValueError("a Diffusers engine's record names its profile, any other engine's "
                             "its kwarg set")
        return self
    peak_mib: float | None = Field(
        default=None, ge=0, description="The request's peak as its engine reports it (MiB); "
                                        "null: none reported.")
    peak_source: PeakSource | None = Field(
        default=None, description="Which figure peak_mib is: upstream's worker peak_memory_mb "
        "(torch's reserved-pool peak over the request), the sim's capacity model, or "
        "torch-reserved (torch.cuda.max_memory_reserved over the request, reset before it); "
        "null: no peak.")
    peak_allocated_mib: float | None = Field(
        default=None, ge=0, description="torch.cuda.max_memory_allocated over the request.")
    start_allocated_mib: float | None = measure("start_allocated_mib")
    start_reserved_mib: float | None = measure("start_reserved_mib")
    kv_cache_bytes: int | None = Field(
        default=None, ge=0, description="Bytes of the K and V tensors the pipeline's conditioning "
                                        "KV cache held after prefill, over the layers it filled.")
    kv_cache_host_bytes: int | None = Field(
        default=None, ge=0, description="Of kv_cache_bytes, those held in host memory (a profile's "
                                        "kv_placement); null: not recorded.")
    kv_cache_layers: int | None = Field(
        default=None, ge=0, description="Of kv_cache_layers_total, the layers the cache filled "
                                        "(fewer when the request failed during prefill).")
    kv_cache_layers_total: int | None = Field(default=None, ge=0)
    prefix_tokens: int | None = Field(
        default=None, ge=0, description="Tokens in the cache: text plus condition-image tokens.")
    prompt_text_tokens: int | None = Field(
        default=None, ge=0, description="Of prefix_tokens, the prompt's own text tokens as the "
        "pipeline encoded it (its template's included, image pads not); the rest are the "
        "references'. null: not recorded (evidence before 2026-12-02).")
    process_mib: float | None = Field(
        default=None, ge=0, description="NVML's figure for the runner at the request's end.")
    outside_pool_mib: float | None = Field(
        default=None, ge=0, description="process_mib less torch's reserved pool at the same "
        "moment: this machine's CUDA context and what else lies outside torch's pool (on a real "
        "card's host: the card's own overhead, [cards] overhead_mib).")
    max_rss_mib: float | None = measure("max_rss_mib")
    host_peak_mib: float | None = measure("host_peak_mib")
    host_end_mib: float | None = measure("host_end_mib")
    pinned_host_peak_mib: float | None = measure("pinned_host_peak_mib")
    pinned_host_start_mib: float | None = measure("pinned_host_start_mib")
    first_step_end_s: float | None = measure("first_step_end_s")
    step_after_first_s: float | None = measure("step_after_first_s")
    decode_s: float | None = measure("decode_s")
    num_inference_steps: int | None = Field(default=None, ge=1)
    true_cfg_scale: float | None = None
    sampling_from: Literal["fixtures", "profile"] | None = Field(
        default=None, description="Whose steps, guidance and seeds it ran: the fixtures' "
                                  "[sampling], or the profile's capacity settings (chosen by "
                                  "omniprobe unless the profile says the seed states them).")

    _host_peak_holds_its_end = model_validator(mode="after")(host_end_within_peak)


class HostRamCheck(EvidenceModel):
    """The host RAM an emulated card's host has, imposed on the runner's process tree."""

    mechanism: Literal["cgroup-v2"] = Field(description="A cgroup v2 memory.max over the tree, "
                                                        "swap 0 (zram is not emulated).")
    cap_mib: int = Field(gt=0)
    peak_mib: float | None = Field(default=None, ge=0,
                                   description="The cgroup's memory.peak; null: not readable.")
    oom_kills: int = Field(ge=0, description="memory.events oom_kill: processes the kernel "
                                             "killed at the cap.")


class DiffusersBuild(EvidenceModel):
    """What the Diffusers engine reports of its build."""

    parameters_b: dict[str, float] = Field(description="Billions of parameters per component.")
    build_s: float = Field(ge=0)
    build_peak_mib: float | None = Field(
        default=None, ge=0, description="torch's reserved peak during the build: NOT the "
                                        "checkpoint's load path, so never an init verdict.")
    resident_mib: float | None = Field(default=None, ge=0,
                                       description="Allocated on the GPU once placed.")
    expandable_segments: bool | None = Field(
        default=None, description="The allocator's setting read back after the build.")
    build_path: Literal["random-streamed", "from-pretrained"] | None = Field(
        default=None, description="How the pipeline was built: random-streamed, the random build "
        "that streams as a load does (components one at a time in from_pretrained's order, each "
        "filled unit by unit, quantised as filled and placed before the next; a real load reads "
        "shards, and a real host's measurement replaces its host figures); from-pretrained: the "
        "snapshot's own load; null: a build made before builds said.")
    build_host_peak_mib: float | None = Field(
        default=None, ge=0, description="The runner's peak resident memory once the build is "
                                        "placed (ru_maxrss: the build's, nothing ran before it).")
    steady_host_mib: float | None = Field(
        default=None, ge=0, description="The runner's resident memory once placed, before any "
                                        "request.")
    pinned_host_mib: float | None = Field(
        default=None, ge=0, description="Of steady_host_mib, page-locked: torch's pinned host "
                                        "allocator (blocks rounded up to powers of two), which no "
                                        "swap or zram can take; null: no CUDA, nothing pinned.")
    pageable_host_mib: float | None = Field(
        default=None, ge=0, description="steady_host_mib less pinned_host_mib: what swap could "
                                        "ever take.")
    host_weights_mib: float | None = Field(
        default=None, ge=0, description="Bytes the components' own tensors hold in host memory "
                                        "once placed (a streamed offload's pinned copies are "
                                        "apart, until each group first offloads).")

    @model_validator(mode="after")
    def _host_figures_agree(self):
        steady, pinned, pageable = (self.steady_host_mib, self.pinned_host_mib,
                                    self.pageable_host_mib)
        if (steady is not None and self.build_host_peak_mib is not None
                and steady > self.build_host_peak_mib):
            raise ValueError(f"steady_host_mib {steady} is above build_host_peak_mib "
                             f"{self.build_host_peak_mib}: the build's peak holds what it left")
        if None not in (steady, pinned, pageable) and abs(
                pageable - max(0.0, steady - pinned)) > 0.1:
            raise ValueError(f"pageable_host_mib {pageable} is not steady_host_mib {steady} "
                             f"less pinned_host_mib {pinned}")
        return self
