"""environment.json's format: the probe environment's manifest, its facts, pins and checks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from omniprobe.evidence.models.common import CheckStatus, EvidenceModel
from omniprobe.evidence.upstream import UpstreamContract


class GpuFacts(EvidenceModel):
    """What NVML says about the host's GPU."""

    index: int = Field(ge=0, description="NVML device index.")
    device_count: int = Field(ge=1)
    name: str
    memory_total_mib: int = Field(ge=0)
    compute_capability: str = Field(pattern=r"^\d+\.\d+$")
    driver_version: str
    cuda_driver_version: str | None = Field(default=None, description="CUDA the driver supports.")


class HostFacts(EvidenceModel):
    """Facts read off the machine while checking the environment."""

    hostname: str
    platform: str
    machine: str
    cpu_count: int | None = None
    memory_total_gib: float | None = Field(default=None, description="null: not readable.")
    gpu: GpuFacts | None = Field(default=None, description="null: NVML gave none (see nvml_error).")
    nvml_error: str | None = None


class EnvPython(EvidenceModel):
    pinned: str
    version: str | None = Field(default=None, description="The venv interpreter's; null: none.")
    executable: str | None = None


class EnvPin(EvidenceModel):
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
                                  "(the Diffusers env's); null: not recorded as chosen.")


class EnvCheck(EvidenceModel):
    name: str = Field(pattern=r"^[a-z0-9_.:-]+$")
    status: CheckStatus
    expected: str | None = None
    actual: str | None = None
    detail: str


class CommandTiming(EvidenceModel):
    command: list[str]
    returncode: int
    seconds: float = Field(ge=0)


class EnvTimings(EvidenceModel):
    total_s: float = Field(ge=0)
    build_s: float | None = Field(default=None, ge=0, description="null: nothing was built.")
    verify_s: float = Field(ge=0)
    phases: dict[str, float] = Field(default={}, description="Seconds per verification phase.")
    commands: list[CommandTiming] = Field(default=[], description="Every command run, in order.")


class EnvManifest(EvidenceModel):
    """environment.json: a host's probe (or Diffusers) environment as built and checked by
    `omniprobe env`."""

    host: str
    env: Literal["probe", "diffusers"] = Field(
        default="probe", description="Which of the host's envs: the probe's ([env]) or the "
                                     "Diffusers engine's Diffusers env ([diffusers_env]).")
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
