"""attempt.json's format: where an attempt came from (its provenance), its pins and its environment."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from omniprobe.config.sources import SourceDocument
from omniprobe.evidence.models.common import EvidenceModel, Sha256, Timestamp, Weights
from omniprobe.limits import MAX_MIB


class Transcribed(EvidenceModel):
    kind: Literal["transcribed"]
    source: SourceDocument = Field(description="The document the figures were copied from.")
    section: str = Field(description="Where in it.")


class Measured(EvidenceModel):
    kind: Literal["measured"]
    host: str
    hostname: str = Field(description="What the machine called itself.")
    tool_version: str
    command: list[str]
    started_at: Timestamp


class Simulated(EvidenceModel):
    kind: Literal["simulated"]
    tool_version: str
    command: list[str]
    started_at: Timestamp
    model: str = Field(description="What was simulated, e.g. 'omniprobe.sim capacity model'.")


class Emulated(EvidenceModel):
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


class AttemptPins(EvidenceModel):
    """The stack an attempt ran on, as its source states it (null: not stated)."""

    upstream_commit: str | None = None
    torch: str | None = None
    model_snapshot: str | None = None


class ServedModel(EvidenceModel):
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


class AttemptEnvironment(EvidenceModel):
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
    env: Literal["probe", "diffusers"] | None = Field(
        default=None, description="The built env that ran: the probe env ([env]) or the "
                                  "Diffusers env ([diffusers_env]); null: the machine's own "
                                  "Python, a simulated host, or recorded before this field.")


class LaterRun(EvidenceModel):
    """A later command that resumed the attempt and added records to it (the first command is
    the provenance's)."""

    command: list[str]
    started_at: Timestamp
    environment_digest: Sha256 | None = Field(
        description="The environment it ran in (resume needs the attempt's own); null: none "
                    "recorded.")
    added: dict[str, Annotated[int, Field(ge=1)]] = Field(
        min_length=1, description="The records it added, per file (e.g. offline-requests.json).")


class Attempt(EvidenceModel):
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
    later_runs: list[LaterRun] = Field(
        default=[], description="Each later command that resumed the attempt and added records "
                                "to it, in order.")
    weights: Weights | None = Field(
        default=None, description="random: every figure comes from random weights and counts for "
                                  "capacity only (fits, OOMs, peaks, KV size), never for output "
                                  "structure, PSNR or speed; null: the model's own weights.")
