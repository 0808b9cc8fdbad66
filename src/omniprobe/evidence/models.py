"""The evidence file formats, one pydantic model per file, and loading them from evidence/.

Layout: evidence/<host>/<attempt-id>/attempt.json plus one file per section (runs.json,
requests.json, ...). A new run adds an attempt folder beside the old ones; nothing is
overwritten. Every attempt says where it came from: transcribed from a source document,
measured by this package on a named host, or simulated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    ValidationError,
    create_model,
    model_serializer,
    model_validator,
)

from omniprobe.atomic import is_temp_file, write_text_atomic
from omniprobe.config.fixtures import Inputs, Seed
from omniprobe.config.inside_path import InsidePath
from omniprobe.config.sources import SourceDocument
from omniprobe.config.strict import STRICT
from omniprobe.errors import InputError, Problem, problems_from_validation
from omniprobe.evidence.migrations import (
    FORMAT_VERSION,
    VERSION_KEY,
    UnknownFormatVersion,
    content_key,
    content_path,
    upgrade,
)
from omniprobe.evidence.quantities import Range, Size
from omniprobe.evidence.upstream import Anchor, UpstreamContract
from omniprobe.limits import MAX_MIB, MAX_WAIT_S, check_timestamp
from omniprobe.safe_io import MissingFile, outside, parse_json, read_text

Outcome = Literal["ok", "oom", "error", "timeout"]
InitOutcome = Literal["ready", "oom", "error", "timeout"]
StructureVerdict = Literal["sound", "broken", "unchecked"]
PeakSource = Literal["worker-reserved", "sim-model", "torch-reserved"]
Weights = Literal["snapshot", "random"]
Sha256Prefix = Annotated[str, Field(pattern=r"^[0-9a-f]{8,64}$")]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
# When something ran: not before 2000, not after now (omniprobe.limits).
Timestamp = Annotated[datetime, AfterValidator(check_timestamp)]
Wall = Annotated[float, Field(ge=0, le=MAX_WAIT_S, description="Seconds, at most a week "
                                                               "(the longest timeout).")]


class _In(BaseModel):
    # Strict when loaded (parse_file): no coercion of "2301" or true to an int; finite floats.
    model_config = STRICT


# --- provenance -------------------------------------------------------------------------


class Transcribed(_In):
    kind: Literal["transcribed"]
    source: SourceDocument = Field(description="The document the figures were copied from.")
    section: str = Field(description="Where in it.")


class Measured(_In):
    kind: Literal["measured"]
    host: str
    hostname: str = Field(description="What the machine called itself.")
    tool_version: str
    command: list[str]
    started_at: Timestamp


class Simulated(_In):
    kind: Literal["simulated"]
    tool_version: str
    command: list[str]
    started_at: Timestamp
    model: str = Field(description="What was simulated, e.g. 'omniprobe.sim capacity model'.")


class Emulated(_In):
    """Measured by this package on a bigger GPU with its memory capped to another card's."""

    kind: Literal["emulated"]
    host: str = Field(description="The emulated host entry of hosts.toml.")
    hostname: str = Field(description="What the machine called itself.")
    tool_version: str
    command: list[str]
    started_at: Timestamp
    emulates: str | None = Field(default=None,
                                 description="The host emulated; null: a bare capacity.")
    cap_mib: int = Field(gt=0, le=MAX_MIB,
                         description="The emulated capacity imposed on the server.")
    physical_gpu: str = Field(description="The GPU it ran on.")
    physical_compute_capability: str = Field(pattern=r"^\d+\.\d+$")
    mechanism: Literal["memory-fraction", "sim-account"] = Field(
        description="How the cap was imposed (hosts.toml [hosts.<host>.emulation] mechanism).")
    simulated_server: bool = Field(
        description="The server was omniprobe.sim: its figures are the capacity model's.")


Provenance = Annotated[Transcribed | Measured | Simulated | Emulated,
                       Field(discriminator="kind")]


class AttemptPins(_In):
    """The stack an attempt ran on, as its source states it (null: not stated)."""

    upstream_commit: str | None = None
    torch: str | None = None
    model_snapshot: str | None = None


class ServedModel(_In):
    """What a probe's server was given for {model}, and whether it is the pinned snapshot."""

    model: str = Field(description="The {model} value: a snapshot folder, a repo id or a path.")
    source: Literal["pinned", "by_hand", "simulated", "random"] = Field(
        description="'pinned': the snapshot folder the env check found at the pinned revision; "
                    "'by_hand': given with --model, not checked against the pin; 'simulated': "
                    "the simulated server, which loads no model; 'random': random weights built "
                    "from the committed configs (capacity only).")
    revision: str | None = Field(
        default=None, description="The served snapshot's commit; null: not known (by hand, "
                                  "simulated, random).")
    configs: str | None = Field(
        default=None, description="Random weights: the committed config folder under models/.")
    config_digests: dict[str, Sha256] = Field(
        default={}, description="Random weights: sha256 of each committed component config file.")
    init_seed: int | None = Field(default=None, ge=0, description="Random weights: the init seed.")


class AttemptEnvironment(_In):
    """The environment a probe attempt ran in: resume continues an attempt only in the same one."""

    manifest: str | None = Field(
        default=None, description="Attempt id of the environment manifest filed for this env "
                                  "(evidence/<host>/<id>/environment.json); null: none filed (a "
                                  "simulated host's env is omniprobe itself).")
    digest: Sha256 = Field(description="sha256 of the env's pins and checks (name, status, "
                                       "expected, actual) and where it runs from.")
    served: ServedModel
    packages: dict[str, str | None] = Field(
        default={}, description="A runner on the machine's own Python: the version of each "
                                "package its engine runs on, as that Python reports it (null: "
                                "not installed).")
    allocator_variable: str | None = Field(
        default=None, description="The allocator variable the env's torch reads, where a "
                                  "profile sets one.")
    host_ram_cap_mib: int | None = Field(
        default=None, gt=0, description="The emulated host RAM its runners ran under (a cgroup's "
                                        "memory.max); null: host RAM was not emulated.")
    env: Literal["probe", "baseline"] | None = Field(
        default=None, description="The built env that ran: the probe env ([env]) or the "
                                  "baseline env ([baseline_env]); null: the machine's own "
                                  "Python, a simulated host, or recorded before this field.")


class Attempt(_In):
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="Equals the folder name.")
    host: str = Field(description="Equals the parent folder name; a hosts.toml host.")
    date: str = Field(description="When it ran, as stated (ISO date, or a range like 2026-10-07/08).")
    description: str
    provenance: Provenance
    baseline: str | None = Field(
        default=None, description="Attempt id of the baseline that speed-ups and PSNR compare to."
    )
    note: str | None = None
    pins: AttemptPins | None = Field(
        default=None, description="The stack it ran on, as stated; null: the environment manifest "
                                  "filed with it or before it says.")
    environment: AttemptEnvironment | None = Field(
        default=None, description="The environment a probe attempt ran in and the model it "
                                  "served; null: not a probe attempt, or made before attempts "
                                  "recorded it.")
    weights: Weights | None = Field(
        default=None, description="random: every figure comes from random weights and counts for "
                                  "capacity only (fits, OOMs, peaks, KV size), never for output "
                                  "structure, PSNR or speed; null: the model's own weights.")


# --- shared pieces ----------------------------------------------------------------------


class CodeRef(_In):
    file: str
    lines: str | None = Field(default=None, pattern=r"^\d+(-\d+)?(ff)?$")
    function: str | None = None
    anchor: Anchor | None = Field(
        default=None, description="What `omniprobe upstream check` looks for in a later upstream.")

    def __str__(self) -> str:
        return f"{self.file}:{self.lines}" if self.lines else self.file


class OomSignature(_In):
    """What PyTorch's CUDA OOM text says, field by field, sizes as written."""

    phase: Literal["init", "request"]
    requested: Size | None = None
    allocated: Size | None = Field(default=None, description="Allocated by PyTorch.")
    reserved_unallocated: Size | None = None
    in_use: Size | None = Field(default=None, description="This process's memory in use.")
    total_capacity: Size | None = None
    allowed: Size | None = Field(default=None, description="Only under a per-process cap.")
    location: CodeRef | None = Field(default=None, description="Innermost frame in model code.")
    via: str | None = None
    note: str | None = None


class EmulationBreach(_In):
    """The first sample at which an emulated server's process tree held more than the cap."""

    t_s: float = Field(ge=0, description="Seconds since the server was started.")
    held_mib: float = Field(ge=0, description="What the process tree held then.")
    cap_mib: int = Field(gt=0)


# --- serve runs -------------------------------------------------------------------------


class FailureCause(_In):
    """Why an init or a request failed, as its log or error text shows it. Only `card` and `host`
    are evidence about the card on its host; the other kinds say the card was never measured."""

    kind: Literal["card", "host", "server", "environment"] = Field(
        description="card: the model or the card (CUDA OOM, a crash in model code); host: the "
                    "card's host ran out of RAM (the kernel killed the process for memory: "
                    "analysis/host_ram.py), evidence about the host as the card's is; server: "
                    "the server software (a traceback in upstream code that is not an OOM); "
                    "environment: the harness or the environment (command not found, import "
                    "error, argument error, a port or permission problem, a dead connection).")
    reason: str = Field(description="What the text shows, e.g. \"import error: No module named 'x'\".")


class InitResult(_In):
    outcome: InitOutcome
    time_s: float | None = Field(default=None, ge=0)
    time_approx: bool = False
    oom: OomSignature | None = None
    note: str | None = None
    cause: FailureCause | None = Field(
        default=None, description="Why init failed; null: ready, or not classified (an OOM at "
                                  "init is the card's all the same).")


class StatedCellFigure(_In):
    """A figure the source states for a cell somewhere other than its per-fixture detail (a summary
    table, a verdict), kept as written so the report can compare it with the detail. Its precision
    is the one written: 44.3 means 44.25 up to 44.35."""

    where: str = Field(description="Where the source states it, e.g. 'the matrix table'.")
    wall_s: Range | None = None
    server_peak_mb: Range | None = None


class Cell(_In):
    """One fixture under one flag set: the summary of its requests."""

    fixture: str
    seeds: list[int] | None = Field(default=None, description="null: not stated.")
    outcome: Outcome
    quality: StructureVerdict = Field(description="Output structure; only 'sound' counts as served.")
    wall_s: Range | None = None
    server_peak_mb: Range | None = Field(default=None, description="Server-reported peak (MB).")
    oom: OomSignature | None = None
    note: str | None = None
    inputs: Inputs = Field(
        default="original", description="The fixture's own inputs, or omniprobe's stand-ins for "
                                        "inputs the source does not state (fixtures.json).")
    stated: list[StatedCellFigure] = Field(
        default=[], description="The same cell's figures as stated elsewhere in the source.")
    emulation_breach: EmulationBreach | None = Field(
        default=None, description="Emulated hosts: the server's tree exceeded the cap by the end "
                                  "of one of these requests; the cell never counts as a fit.")


class ArtifactRef(_In):
    """A large file kept outside git, in the project's artifacts folder."""

    path: InsidePath = Field(description="Relative to the artifacts folder.")
    sha256: Sha256
    bytes: int = Field(ge=0)


class TimelinePoint(_In):
    t_s: float = Field(ge=0, description="Seconds since the server was started.")
    device_mib: float = Field(ge=0)
    process_mib: float | None = Field(default=None, ge=0, description="The server's processes.")


class CappedProcess(_In):
    """One server process as the emulation hook capped it (from its line in the server log)."""

    pid: int
    context_mib: float = Field(ge=0)
    allowed_mib: float = Field(ge=0, description="What PyTorch's allocator may reserve.")


class EmulationCheck(_In):
    """The sampler's guard of an emulated host: the server's process tree against the cap."""

    cap_mib: int = Field(gt=0)
    checked_samples: int = Field(ge=0)
    unchecked_samples: int = Field(
        default=0, ge=0, description="Samples in which NVML gave no figure for the tree.")
    peak_mib: float | None = Field(default=None, ge=0, description="The tree's peak.")
    breach: EmulationBreach | None = Field(default=None, description="The first breach.")
    capped: list[CappedProcess] = Field(
        default=[], description="Processes the hook capped; empty under the sim-account mechanism.")


class TimelineSummary(_In):
    """A GPU memory series of one server lifetime, summarised; the full series is an artifact."""

    sampler: str = Field(description="What was read, e.g. 'NVML' or the sim's modelled memory.")
    state: Literal["sampled", "unavailable", "incomplete"] = Field(
        description="incomplete: the sampler died during the lifetime; its series is cut short "
                    "and its peak is no peak of the lifetime.")
    reason: str | None = Field(default=None, description="Why nothing (or not everything) could "
                                                         "be sampled.")
    target_hz: float = Field(gt=0)
    rate_hz: float | None = Field(default=None, ge=0, description="The rate achieved.")
    samples: int = Field(ge=0)
    peak_mib: float | None = Field(default=None, ge=0,
                                   description="The server's own peak, else the device's.")
    peak_source: Literal["process", "device"] | None = None
    peak_t_s: float | None = Field(default=None, ge=0)
    device_peak_mib: float | None = Field(default=None, ge=0)
    series: ArtifactRef | None = Field(default=None, description="The JSONL series.")
    points: list[TimelinePoint] = Field(
        default=[], description="Peak-preserving reduction of the series, for the report's figure.")
    emulation: EmulationCheck | None = Field(default=None, description="Emulated hosts only.")
    idle_baseline_mib: float | None = Field(
        default=None, ge=0, description="The device's used memory at the run's first idle "
                                        "reading; null: not read.")
    idle_mib: float | None = Field(
        default=None, ge=0, description="The device's used memory, idle, just before this server "
                                        "started: another program's VRAM moved by the difference "
                                        "from idle_baseline_mib, within the host's "
                                        "idle_tolerance_mib.")


class ServerLifetime(_In):
    """One start of the server under a flag set, as the probe ran it."""

    session: Literal["probe-init", "probe-serve"]
    started_at: Timestamp
    command: list[str]
    init: InitResult
    ended: str | None = Field(default=None, description="How it ended, e.g. 'stopped', 'exited 1'.")
    cuda_visible_devices: str | None = Field(
        default=None, description="The CUDA_VISIBLE_DEVICES the server ran with (--gpu-index); "
                                  "the timeline's sampler names the device it watched. null: "
                                  "not recorded.")
    log: ArtifactRef | None = None
    timeline: TimelineSummary | None = None
    deploy_config_ignored: bool | None = Field(
        default=None, description="Whether the log carries upstream's 'No registered "
        "PipelineConfig resolved for model' warning: the flag set's --deploy-config was accepted "
        "and ignored; null: the flag set passes no deploy config.")
    request_timeout_s: float | None = Field(
        default=None, gt=0, le=MAX_WAIT_S,
        description="The request timeout in force for this lifetime's requests (their walls are "
                    "bounded by it); null: not recorded (made before lifetimes recorded it).")
    server_group: int | None = Field(
        default=None, gt=0, description="The server's process group (its supervisor's pid): a "
                                        "resume stops it if a killed probe left it running.")
    server_started: str | None = Field(
        default=None, pattern=r"^[0-9a-f-]+/\d+$",
        description="When the supervisor started, '<boot id>/<clock ticks>' (Linux /proc): a "
                    "reused pid is never taken for the server.")


class ServeRun(_In):
    """One flag set's run: its init and its cells; a probed run holds every server lifetime it
    took (`lifetimes`, the latest last: a restart after a crash is another)."""

    flag_set: str
    init: InitResult
    gpu_peak_mib: int | None = Field(default=None, ge=0, description="GPU memory series max.")
    gpu_sampler: str | None = Field(default=None, description="What sampled the series.")
    cells: list[Cell] = []
    note: str | None = None
    lifetimes: list[ServerLifetime] = Field(
        default=[], description="Probed runs only; init is the latest lifetime's.")


class ImageMetrics(_In):
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


# --- what one request's record must agree with itself on ----------------------------------
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


def quality_is_its_image_check(record) -> None:
    """'sound' or 'broken' is the verdict of the record's own image check."""
    if record.quality == "unchecked":
        return
    if record.outcome != "ok":
        raise ValueError(f"quality: {record.quality!r} judges an image, and a {record.outcome!r} "
                         "record returned none; expected 'unchecked'")
    if record.image is None:
        raise ValueError(f"quality: {record.quality!r} needs the image check it comes from "
                         "(image), which the record lacks")
    if record.image.verdict != record.quality:
        raise ValueError(f"quality: {record.quality!r} disagrees with the record's image check "
                         f"(image.verdict {record.image.verdict!r})")


def oom_states_its_signature(record) -> None:
    """An OOM holds the signature parsed from its message, or the message none was parsed from;
    any other outcome holds none."""
    if record.outcome == "oom" and record.oom is None and not record.error:
        raise ValueError("oom: required: an 'oom' record holds its OOM signature or, where none "
                         "was found, the error text it came with (error)")
    if record.outcome != "oom" and record.oom is not None:
        raise ValueError(f"oom: a {record.outcome!r} record holds no OOM signature")


RECORD_INVARIANTS = (ok_names_its_image, quality_is_its_image_check, oom_states_its_signature)


def record_invariants(record):
    for invariant in RECORD_INVARIANTS:
        invariant(record)
    return record


class Measurement(_In):
    """What every engine's request record holds (serve, offline Omni, Diffusers): one fixture and
    seed, its outcome, its image's hashes and structure, its OOM and its cause."""

    fixture: str
    seed: Seed
    outcome: Outcome
    quality: StructureVerdict
    wall_s: Wall
    output_sha256: Sha256 | None = None
    pixels_sha256: Sha256 | None = Field(default=None, description="imaging.pixels_sha256.")
    artifact: InsidePath | None = Field(
        default=None, description="Image path outside git, relative to the artifacts folder.")
    image: ImageMetrics | None = None
    quality_note: str | None = Field(
        default=None, description="Why quality is unchecked for an image that came back (random "
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
        if self.weights == "random" and (self.quality != "unchecked" or self.image is not None):
            raise ValueError("a random-weight record claims no output structure: quality must be "
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

    @model_serializer(mode="wrap")
    def _transport_failure_only_when_true(self, handler):
        """A request that was answered says nothing of transport: its file stays as it was when
        the field was optional (absent, never false)."""
        data = handler(self)
        if not self.transport_failure:
            data.pop("transport_failure", None)
        return data


# --- offline, quality, reproducibility --------------------------------------------------


class OfflineRun(_In):
    kwarg_set: str
    fixture: str | None = None
    seeds: list[int] | None = None
    outcome: Literal["ok", "oom", "error", "timeout", "init-oom", "init-error"]
    quality: StructureVerdict
    oom: OomSignature | None = None
    note: str | None = None
    wall_s: Range | None = Field(default=None, description="Probed runs: walls of the ok requests.")
    init_s: float | None = Field(default=None, ge=0,
                                 description="Probed runs: seconds until the engine was built.")
    logs: list[ArtifactRef] = Field(default=[], description="Probed runs: the runner's logs.")
    cause: FailureCause | None = Field(
        default=None, description="Why init failed; null: it did not, or not classified.")
    timelines: list[TimelineSummary] = Field(
        default=[], description="Probed runs: one GPU memory series per runner process.")
    build: DiffusersBuild | None = Field(default=None, description="Diffusers engines only.")
    host_ram: list[HostRamCheck] = Field(
        default=[], description="Emulated host RAM, one per runner process; empty: host RAM was "
                                "not emulated (the machine's own held what offload moved).")


class OfflineRequest(Measurement):
    """One fixture and seed generated by an offline engine (vLLM-Omni's `Omni(...)`, the sim's,
    or the Diffusers pipeline), as the package measured it: a serve RequestRecord's measurement,
    keyed by the kwarg set (on a Diffusers host, the profile) instead of a flag set."""

    kwarg_set: str = Field(description="The offline kwarg set, or on a Diffusers host the "
                                       "Diffusers profile.")
    engine: Literal["omni", "diffusers"] | None = Field(
        default=None, description="The runner's engine; null: omni (or a record made before "
                                  "records said).")
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
    start_allocated_mib: float | None = Field(
        default=None, ge=0, description="What torch held allocated when the request began.")
    kv_cache_bytes: int | None = Field(
        default=None, ge=0, description="Bytes of the K and V tensors the pipeline's conditioning "
                                        "KV cache held after prefill, over the layers it filled.")
    kv_cache_layers: int | None = Field(
        default=None, ge=0, description="Of kv_cache_layers_total, the layers the cache filled "
                                        "(fewer when the request failed during prefill).")
    kv_cache_layers_total: int | None = Field(default=None, ge=0)
    prefix_tokens: int | None = Field(
        default=None, ge=0, description="Tokens in the cache: text plus condition-image tokens.")
    max_rss_mib: float | None = Field(
        default=None, ge=0, description="The runner process's peak resident memory so far.")
    num_inference_steps: int | None = Field(default=None, ge=1)
    true_cfg_scale: float | None = None
    sampling_from: Literal["fixtures", "profile"] | None = Field(
        default=None, description="Whose steps, guidance and seeds it ran: the fixtures' "
                                  "[sampling], or the profile's capacity settings (chosen by "
                                  "omniprobe unless the profile says the seed states them).")


class HostRamCheck(_In):
    """The host RAM an emulated card's host has, imposed on the runner's process tree."""

    mechanism: Literal["cgroup-v2"] = Field(description="A cgroup v2 memory.max over the tree, "
                                                        "swap 0 (zram is not emulated).")
    cap_mib: int = Field(gt=0)
    peak_mib: float | None = Field(default=None, ge=0,
                                   description="The cgroup's memory.peak; null: not readable.")
    oom_kills: int = Field(ge=0, description="memory.events oom_kill: processes the kernel "
                                             "killed at the cap.")


class DiffusersBuild(_In):
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


class StructureObservation(_In):
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
    quality: StructureVerdict
    note: str | None = None


class PsnrRow(_In):
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
    quality: StructureVerdict
    note: str | None = None

    @model_validator(mode="after")
    def _psnr_unless_identical(self) -> PsnrRow:
        if (self.psnr_db is None) != self.identical:
            raise ValueError("psnr_db is required, and only absent when identical is true")
        return self


class DeterminismGroup(_In):
    fixture: str
    seed: int
    flag_sets: list[str] = Field(min_length=2)
    sha256_prefix: Sha256Prefix
    compared: Literal["bytes", "pixels"]
    identical: bool


class PropagationCheck(_In):
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


class CodeLocation(_In):
    """A fact read off the upstream code, with where it was read when the source says."""

    key: str
    ref: CodeRef | None = None
    what: str
    label: str | None = Field(default=None, description="What the report calls it, in words.")


class Finding(_In):
    """A conclusion the source states, placed where the source puts it."""

    key: str = Field(pattern=r"^[a-z0-9_]+$")
    statement: str
    placement: Literal["verdict", "ceiling", "structure", "speed", "follow-through"] = Field(
        description="Where the report states it: the verdict; the usable ceiling's opening line (a "
                    "qualification of it); the output-structure section; the line of the speed-up "
                    "of a broken flag set; the follow-through.")
    section: str = Field(description="The source's section it comes from.")


class BaselineWall(_In):
    fixture: str
    wall_s: float = Field(gt=0)


class Baseline(_In):
    attempt_id: str
    profile: str
    engine: str
    dit: str
    kv_cache: bool
    walls: list[BaselineWall]
    note: str | None = None


class Correction(_In):
    subject: str
    claimed: str
    finding: str
    artifacts: list[str] = []
    opaque_fraction: float | None = None
    stands: str | None = Field(default=None, description="What of the corrected claim stands.")
    stands_figure: str | None = Field(default=None, description="The key of the stated figure it gives.")
    falls: str | None = Field(default=None, description="What of it does not stand.")


class StatedFigure(_In):
    """A figure the source states as its own estimate or citation, kept apart from measurements."""

    key: str = Field(pattern=r"^[a-z0-9_]+$")
    value: float | None = None
    range: Range | None = None
    unit: str
    approximate: bool = Field(default=False, description="The seed writes it as approximate (~, ≈, roughly).")
    statement: str
    label: str | None = Field(default=None, description="What the report calls it, in words.")


# --- probe environment ------------------------------------------------------------------

CheckStatus = Literal["pass", "fail", "skip"]


class GpuFacts(_In):
    """What NVML says about the host's GPU."""

    index: int = Field(ge=0, description="NVML device index.")
    device_count: int = Field(ge=1)
    name: str
    memory_total_mib: int = Field(ge=0)
    compute_capability: str = Field(pattern=r"^\d+\.\d+$")
    driver_version: str
    cuda_driver_version: str | None = Field(default=None, description="CUDA the driver supports.")


class HostFacts(_In):
    """Facts read off the machine while checking the environment."""

    hostname: str
    platform: str
    machine: str
    cpu_count: int | None = None
    memory_total_gib: float | None = Field(default=None, description="null: not readable.")
    gpu: GpuFacts | None = Field(default=None, description="null: NVML gave none (see nvml_error).")
    nvml_error: str | None = None


class EnvPython(_In):
    pinned: str
    version: str | None = Field(default=None, description="The venv interpreter's; null: none.")
    executable: str | None = None


class EnvPin(_In):
    """One install step's pin and what the venv holds for it."""

    name: str
    kind: Literal["index", "git"]
    pin: str = Field(description="The version, or the (abbreviated) commit.")
    source: str = Field(description="Index URL, 'default index', or the git repository.")
    editable: bool = False
    installed_version: str | None = Field(default=None, description="null: not installed.")
    resolved: str | None = Field(
        default=None, description="Installed version, or the full installed commit for git pins."
    )
    override: str | None = Field(
        default=None, description="Who chose, and why, that this pin replaces every other "
                                  "package's requirement on it (uv --override); null: none.")
    chosen: str | None = Field(
        default=None, description="Who chose this pin, and why, where the seed states none "
                                  "(the baseline env's); null: not recorded as chosen.")


class EnvCheck(_In):
    name: str = Field(pattern=r"^[a-z0-9_.:-]+$")
    status: CheckStatus
    expected: str | None = None
    actual: str | None = None
    detail: str


class CommandTiming(_In):
    command: list[str]
    returncode: int
    seconds: float = Field(ge=0)


class EnvTimings(_In):
    total_s: float = Field(ge=0)
    build_s: float | None = Field(default=None, ge=0, description="null: nothing was built.")
    verify_s: float = Field(ge=0)
    phases: dict[str, float] = Field(default={}, description="Seconds per verification phase.")
    commands: list[CommandTiming] = Field(default=[], description="Every command run, in order.")


class EnvManifest(_In):
    """environment.json: a host's probe (or baseline) environment as built and checked by
    `omniprobe env`."""

    host: str
    env: Literal["probe", "baseline"] = Field(
        default="probe", description="Which of the host's envs: the probe's ([env]) or the "
                                     "Diffusers engine's baseline env ([baseline_env]).")
    action: Literal["built", "verified"] = Field(
        description="'built': this run installed; 'verified': a no-op re-run that only checked."
    )
    venv: str
    pins_hash: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hash of the pins built to.")
    uv_version: str | None = None
    python: EnvPython
    host_facts: HostFacts
    model_snapshot: str = Field(description="The pinned 'repo@revision'.")
    pins: list[EnvPin]
    freeze: list[str] = Field(description="`uv pip freeze` of the venv, line by line.")
    checks: list[EnvCheck] = Field(min_length=1)
    timings: EnvTimings
    upstream: UpstreamContract | None = Field(
        default=None, description="`omniprobe upstream check`'s named checks against the env's "
                                  "own clone of vLLM-Omni (no citations); null: none was read.")
    upstream_note: str | None = Field(
        default=None, description="Why the clone's contract was not read, where it was not.")

    @property
    def failed_checks(self) -> list[EnvCheck]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def ok(self) -> bool:
        return not self.failed_checks


# --- files ------------------------------------------------------------------------------

# Each file's content; the file itself wraps it with its format version (evidence/migrations.py).
FILE_CONTENT: dict[str, type] = {
    "attempt.json": Attempt,
    "runs.json": list[ServeRun],
    "requests.json": list[RequestRecord],
    "offline.json": list[OfflineRun],
    "offline-requests.json": list[OfflineRequest],
    "structure.json": list[StructureObservation],
    "psnr.json": list[PsnrRow],
    "determinism.json": list[DeterminismGroup],
    "propagation.json": list[PropagationCheck],
    "code-read.json": list[CodeLocation],
    "baseline.json": Baseline,
    "corrections.json": list[Correction],
    "figures.json": list[StatedFigure],
    "findings.json": list[Finding],
    "environment.json": EnvManifest,
    "upstream.json": UpstreamContract,
}
ATTEMPT_FILE = "attempt.json"


def _file_model(file_name: str, content: type) -> type[BaseModel]:
    key = content_key(file_name)
    return create_model(
        "".join(part.title() for part in key.split("_")) + "File",
        __config__=STRICT,
        __doc__=f"{file_name}: the evidence format version, then the content under {key!r}.",
        **{VERSION_KEY: (Literal[FORMAT_VERSION], Field(
            description="Evidence format version; a file without it is version 1 and is "
                        "migrated on load.")),
           key: (content, ...)},
    )


FILE_MODELS: dict[str, type[BaseModel]] = {
    name: _file_model(name, content) for name, content in FILE_CONTENT.items()}
SECTION_FILES = [name for name in FILE_MODELS if name != ATTEMPT_FILE]


@dataclass
class LoadedAttempt:
    path: Path
    meta: Attempt
    runs: list[ServeRun] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    offline: list[OfflineRun] = field(default_factory=list)
    offline_requests: list[OfflineRequest] = field(default_factory=list)
    structure: list[StructureObservation] = field(default_factory=list)
    psnr: list[PsnrRow] = field(default_factory=list)
    determinism: list[DeterminismGroup] = field(default_factory=list)
    propagation: list[PropagationCheck] = field(default_factory=list)
    code_read: list[CodeLocation] = field(default_factory=list)
    baseline: Baseline | None = None
    corrections: list[Correction] = field(default_factory=list)
    figures: list[StatedFigure] = field(default_factory=list)
    environment: EnvManifest | None = None
    findings: list[Finding] = field(default_factory=list)
    upstream: UpstreamContract | None = None

    @property
    def id(self) -> str:
        return self.meta.id

    @property
    def host(self) -> str:
        return self.meta.host

    @property
    def simulated(self) -> bool:
        """Its figures come from omniprobe.sim (an emulated run of the sim server included)."""
        prov = self.meta.provenance
        return prov.kind == "simulated" or (prov.kind == "emulated" and prov.simulated_server)

    @property
    def emulated(self) -> bool:
        return self.meta.provenance.kind == "emulated"


# Validated contents by (file name, text): a content is a pure function of the two, and a process
# that loads the evidence again (validate then report; the tests) parses each text once. Only
# successes are kept, so every error still names the file it came from.
_PARSED: dict[tuple[str, str], object] = {}
_PARSED_MAX = 1024


def parse_file(path: Path, text: str | None = None):
    """One evidence file's content, its kind told by its name, migrated from an older format
    version; raise InputError naming the file and the JSON path of every problem."""
    text = read_text(path) if text is None else text
    key = (path.name, text)
    if key not in _PARSED:
        if len(_PARSED) >= _PARSED_MAX:
            del _PARSED[next(iter(_PARSED))]
        _PARSED[key] = _parse(path, text)
    value = _PARSED[key]
    # The models are frozen; a section that is a list is copied, so appending to it (a probe
    # resuming its attempt) changes no other reader's.
    return list(value) if isinstance(value, list) else value


def _parse(path: Path, text: str):
    model = FILE_MODELS[path.name]
    data = parse_json(path, text)
    try:
        data, found = upgrade(path.name, data)
    except UnknownFormatVersion as exc:
        raise InputError([Problem(str(path), f"$.{VERSION_KEY}", str(exc))]) from None
    try:
        # Validated as JSON, strictly: timestamps are ISO text there, and nothing is coerced.
        value = model.model_validate_json(text if found == FORMAT_VERSION else json.dumps(data),
                                          strict=True)
    except ValidationError as exc:
        problems = problems_from_validation(path, exc)
        if found != FORMAT_VERSION:
            problems = [replace(p, message=f"{p.message} (a format version {found} file, "
                                           f"path as in version {FORMAT_VERSION})")
                        for p in problems]
        raise InputError(problems) from None
    return getattr(value, content_key(path.name))


def load_attempt(folder: Path) -> tuple[LoadedAttempt | None, list[Problem]]:
    """Load one attempt folder, collecting every problem rather than stopping at the first.
    A file symlinked from outside evidence/ is refused, not read."""
    problems: list[Problem] = []
    evidence_root = folder.parent.parent
    for child in (folder, *sorted(folder.iterdir())):
        real = outside(child, evidence_root)
        if real is not None:
            problems.append(Problem(str(child), "", f"a symlink to {real}, outside "
                                                    f"{evidence_root}; evidence lives in evidence/"))
    if problems:
        return None, problems
    try:
        meta = parse_file(folder / ATTEMPT_FILE)
    except MissingFile:
        return None, [Problem(str(folder), "", f"attempt folder has no {ATTEMPT_FILE}")]
    except InputError as exc:
        return None, exc.problems
    attempt = LoadedAttempt(path=folder, meta=meta)
    if meta.id != folder.name:
        problems.append(Problem(str(folder / ATTEMPT_FILE), content_path(ATTEMPT_FILE, "$.id"),
                                f"expected the folder name {folder.name!r}, got {meta.id!r}"))
    if meta.host != folder.parent.name:
        problems.append(Problem(str(folder / ATTEMPT_FILE), content_path(ATTEMPT_FILE, "$.host"),
                                f"expected the host folder {folder.parent.name!r}, got {meta.host!r}"))
    for child in sorted(folder.iterdir()):
        if child.name == ATTEMPT_FILE or is_temp_file(child):  # a write in flight is no evidence
            continue
        if child.name not in SECTION_FILES:
            problems.append(Problem(str(child), "", "unknown evidence file; expected one of "
                                    + ", ".join(SECTION_FILES)))
            continue
        try:
            setattr(attempt, content_key(child.name), parse_file(child))
        except InputError as exc:
            problems.extend(exc.problems)
    return attempt, problems


@dataclass
class Evidence:
    attempts: list[LoadedAttempt]

    def for_host(self, host: str, *, include_simulated: bool = False,
                 include_emulated: bool = False) -> list[LoadedAttempt]:
        return [a for a in self.attempts
                if a.host == host and (include_simulated or not a.simulated)
                and (include_emulated or not a.emulated)]

    def attempt(self, attempt_id: str) -> LoadedAttempt:
        for a in self.attempts:
            if a.id == attempt_id:
                return a
        raise KeyError(f"no attempt {attempt_id!r} under evidence/")


def load_evidence(root: Path) -> tuple[Evidence, list[Problem]]:
    attempts, problems = [], []
    if not root.is_dir():
        return Evidence([]), [Problem(str(root), "", "evidence folder not found")]
    for host_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for folder in sorted(p for p in host_dir.iterdir() if p.is_dir()):
            attempt, found = load_attempt(folder)
            problems.extend(found)
            if attempt is not None:
                attempts.append(attempt)
    return Evidence(attempts), problems


def dump_json(file_name: str, content) -> str:
    """A file's text in the current format version, validated exactly as it will be on load."""
    checked = FILE_MODELS[file_name].model_validate(
        {VERSION_KEY: FORMAT_VERSION, content_key(file_name): content})
    return checked.model_dump_json(indent=2, exclude_none=True) + "\n"


def write_section(folder: Path, file_name: str, content) -> Path:
    """Validate, then write one evidence file atomically; a bad value leaves the old file intact."""
    return write_text_atomic(folder / file_name, dump_json(file_name, content))
