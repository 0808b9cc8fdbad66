"""runs.json's format: a flag set's served run, its init, its cells and its server lifetimes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from omniprobe.config.fixtures import Inputs
from omniprobe.evidence.models.common import (
    ArtifactRef,
    EmulationBreach,
    EvidenceModel,
    FailureCause,
    InitOutcome,
    OomSignature,
    Outcome,
    StructureVerdict,
    Timestamp,
)
from omniprobe.evidence.quantities import Range
from omniprobe.limits import MAX_WAIT_S


class InitResult(EvidenceModel):
    outcome: InitOutcome
    time_s: float | None = Field(default=None, ge=0)
    time_approx: bool = False
    oom: OomSignature | None = None
    note: str | None = None
    cause: FailureCause | None = Field(
        default=None, description="Why init failed; null: ready, or not classified (an OOM at "
                                  "init is the card's all the same).")


class StatedCellFigure(EvidenceModel):
    """A figure the source states for a cell somewhere other than its per-fixture detail (a summary
    table, a verdict), kept as written so the report can compare it with the detail. Its precision
    is the one written: 44.3 means 44.25 up to 44.35."""

    where: str = Field(description="Where the source states it, e.g. 'the matrix table'.")
    wall_s: Range | None = None
    server_peak_mb: Range | None = None


class Cell(EvidenceModel):
    """One fixture under one flag set: the summary of its requests."""

    fixture: str
    seeds: list[int] | None = Field(default=None, description="null: not stated.")
    outcome: Outcome
    structure: StructureVerdict = Field(description="Output structure; only 'sound' counts as served.")
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


class TimelinePoint(EvidenceModel):
    t_s: float = Field(ge=0, description="Seconds since the server was started.")
    device_mib: float = Field(ge=0)
    process_mib: float | None = Field(default=None, ge=0, description="The server's processes.")


class CappedProcess(EvidenceModel):
    """One server process as the emulation hook capped it (from its line in the server log)."""

    pid: int
    context_mib: float = Field(ge=0)
    allowed_mib: float = Field(ge=0, description="What PyTorch's allocator may reserve.")


class EmulationCheck(EvidenceModel):
    """The sampler's guard of an emulated host: the server's process tree against the cap."""

    cap_mib: int = Field(gt=0)
    checked_samples: int = Field(ge=0)
    unchecked_samples: int = Field(
        default=0, ge=0, description="Samples in which NVML gave no figure for the tree.")
    peak_mib: float | None = Field(default=None, ge=0, description="The tree's peak.")
    breach: EmulationBreach | None = Field(default=None, description="The first breach.")
    capped: list[CappedProcess] = Field(
        default=[], description="Processes the hook capped; empty under the sim-account mechanism.")


class TimelineSummary(EvidenceModel):
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
    first_idle_mib: float | None = Field(
        default=None, ge=0, description="The device's used memory at the run's first idle "
                                        "reading; null: not read.")
    idle_mib: float | None = Field(
        default=None, ge=0, description="The device's used memory, idle, just before this server "
                                        "started: another program's VRAM moved by the difference "
                                        "from first_idle_mib, within the host's "
                                        "idle_tolerance_mib.")


class ServerLifetime(EvidenceModel):
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


class ServeRun(EvidenceModel):
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
