"""hosts.toml's [hosts.<name>]: one host, and its emulation of another card (a simulated host's
capacity model is sim.toml's, config/sim_config.py)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from omniprobe.config.command_rules import (
    OFFLINE_PLACEHOLDERS,
    OWN_ENV_PREFIX,
    SERVE_PLACEHOLDERS,
    not_a_shell,
    not_the_harness_options,
    placeholder_problems,
)
from omniprobe.config.diffusers import DiffusersHost
from omniprobe.config.flag_sets import ArgsCheck
from omniprobe.config.hosts_common import HostsTable, PositiveMib
from omniprobe.config.names import Name
from omniprobe.config.sim_config import SimCapacity
from omniprobe.limits import MAX_MIB, MAX_VRAM_GB


class GpuMinimum(HostsTable):
    """Any machine whose GPU has at least this much memory and this compute capability: no
    hostname or GPU name is checked, these are."""

    memory_gib: int = Field(gt=0, le=MAX_VRAM_GB, description="NVML's memory.total, in GiB, "
                                                              "at least.")
    compute_capability: str = Field(pattern=r"^\d+\.\d+$", description="At least, as major.minor.")

    def capable(self, compute_capability: str) -> bool:
        """A compute capability at or above the minimum (compared as numbers: 10.0 > 9.0)."""
        return _version(compute_capability) >= _version(self.compute_capability)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


class Emulation(HostsTable):
    """What an emulated host stands in for, and how its capacity is imposed on the GPU it runs on.

    The host entry itself describes the physical GPU (gpu, compute_capability and vram_gb are what
    the env checks compare NVML against); this table names the card it emulates.
    """

    emulates: str | None = Field(
        default=None, description="The host entry it emulates; its flag sets and offline kwarg "
                                  "sets are taken (and, for a simulated one, its capacity model).")
    capacity_mib: PositiveMib | None = Field(
        default=None, description="The emulated capacity; default: the emulated host's "
                                        "(vram_gb GiB, or a simulated host's vram_mib).")
    host_ram_gib: float | None = Field(
        default=None, gt=0, le=4096,
        description="The emulated card's host RAM, imposed on the offline runner's process tree "
                    "(cgroup v2 memory.max); null: host RAM is not emulated.")
    mechanism: Literal["memory-fraction", "sim-account"] = Field(
        description="memory-fraction: a startup hook on the server's PYTHONPATH caps PyTorch in "
                    "every server process (cap less its CUDA context), and the sampler checks "
                    "the process tree against the cap; sim-account: the simulated server's "
                    "accounted memory takes the cap as its total (no GPU).")

    @model_validator(mode="after")
    def _names_a_capacity(self) -> Emulation:
        if self.emulates is None and self.capacity_mib is None:
            raise ValueError("an emulation names the host it emulates ('emulates') or a "
                             "'capacity_mib'")
        return self


HostKind = Literal["omni", "sim", "diffusers"]  # host_kinds.KIND_KEYS's keys (a test holds it)


class Host(HostsTable):
    kind: HostKind = Field(description="What the host is: omni, vLLM-Omni's server and offline "
                                       "engine; sim, omniprobe's simulated server; diffusers, "
                                       "the Diffusers engine over its profiles. Each kind takes "
                                       "its own keys (config/host_kinds.py).")
    name: str = Field(description="Human name of the host, e.g. 'RTX 3090'.")
    hostname: str
    gpu: str
    compute_capability: str = Field(pattern=r"^\d+\.\d+$",
                                    description="As major.minor; 0.0: no GPU (the CPU).")
    vram_gb: int = Field(gt=0, le=MAX_VRAM_GB, description="Nominal VRAM as marketed (GB).")
    host_ram_gib: float | None = Field(default=None, gt=0, le=MAX_MIB,
                                       description="null: not stated.")
    host_ram_note: str | None = None
    card: str | None = Field(default=None, description="The [cards] entry of this host's GPU, "
                                                       "whose usable pool its verdicts read.")
    python_provider: str = Field(description="How the pinned Python is provided on this host.")
    idle_tolerance_mib: float = Field(
        default=256, ge=0,
        description="How far the GPU's used memory may sit above the run's first idle reading "
                    "when a server or runner is about to start: another program's VRAM moving "
                    "within it (a desktop's compositor, a browser) is recorded on the timeline "
                    "(idle_mib), not fatal. Chosen by omniprobe, not the seed.")
    gpu_minimum: GpuMinimum | None = Field(
        default=None, description="A host that is any machine with such a GPU (a rented one): "
                                  "its hostname and GPU name are words, NVML's memory and "
                                  "compute capability are checked against these minimums.")
    simulated: bool = False
    serve_flag_sets: list[str] = []
    offline_kwarg_sets: list[str] = []
    serve_command: list[str] | None = Field(
        default=None, min_length=1,
        description="Replaces [serve] command on this host; {python}, {model}, {hosts_file} "
                    "and {host} are filled in.",
    )
    offline_command: list[str] | None = Field(
        default=None, min_length=1,
        description="Runs the offline runner on this host; {python}, {runner}, {hosts_file} and "
                    "{host} are filled in ({runner}: the folder a Python runs as the engine "
                    "package's runner, omniprobe_engine/launch.py). Default: the host's pinned "
                    "venv python and {runner}.",
    )
    args_check: ArgsCheck | None = Field(
        default=None, description="Replaces [serve] args_check on this host (with serve_command).")
    # sim.toml's [capacity.<name>], set by load_hosts (hosts.toml refuses the key): not part of
    # hosts.toml's schema.
    capacity: SkipJsonSchema[SimCapacity | None] = Field(default=None)
    emulation: Emulation | None = Field(
        default=None, description="An emulated host: the card it emulates on this physical GPU.")
    model_code: list[str] = Field(
        # Filled in by HostsConfig where a host states none (model_folders): the served model's
        # own folder, so a crash elsewhere in vLLM-Omni (its entrypoints) is the server's. (A
        # factory: the schema shows no default, which [serve] decides.)
        default_factory=list, min_length=1,
        description="Path fragments of the model's source files: an OOM's location is the "
                    "innermost traceback frame in them, and a crash there is the card's (a "
                    "traceback elsewhere in upstream code is the server software's). Default: "
                    "the served model's own folder, vllm_omni/diffusion/models/<model>/.",
    )
    diffusers: DiffusersHost | None = Field(
        default=None, description="A Diffusers host: probe-offline runs the Diffusers engine over "
                                  "its diffusers_profiles, with these weights.")
    diffusers_profiles: list[str] = Field(
        default=[], description="The [diffusers_profiles] its offline runs build (Diffusers "
                                "hosts only).")
    diffusers_profile_list: Name | None = Field(
        default=None, description="A [diffusers_profile_lists] entry: its profiles are this "
                                  "host's diffusers_profiles (stated in place of them).")
    memory_file_env: str | None = Field(
        default=None, pattern=rf"^{OWN_ENV_PREFIX}[A-Z0-9_]+$",
        description="The environment variable that tells the host's server (or offline runner) "
                    "the file to publish its memory in, where NVML cannot see it (a simulated "
                    "host); the sampler reads that file instead of NVML. null: NVML.",
    )

    @property
    def has_gpu(self) -> bool:
        return _version(self.compute_capability) > (0, 0)

    @field_validator("serve_command")
    @classmethod
    def _serve_placeholders(cls, command: list[str] | None) -> list[str] | None:
        return not_the_harness_options(not_a_shell(placeholder_problems(
            command, SERVE_PLACEHOLDERS)), "a flag set's args add the rest")

    @field_validator("offline_command")
    @classmethod
    def _offline_placeholders(cls, command: list[str] | None) -> list[str] | None:
        return not_a_shell(placeholder_problems(command, OFFLINE_PLACEHOLDERS))

    @model_validator(mode="after")
    def _capacity_iff_simulated(self) -> Host:
        if self.simulated and self.capacity is None:
            raise ValueError("a simulated host needs its capacity model: sim.toml [capacity.<name>]")
        if not self.simulated and self.capacity is not None:
            raise ValueError("only a simulated host has a capacity model (sim.toml [capacity])")
        if (self.diffusers is None) == bool(self.diffusers_profiles):
            if self.diffusers is not None:
                raise ValueError("a [diffusers] host needs diffusers_profiles")
            if self.diffusers_profiles:
                raise ValueError("diffusers_profiles need a [hosts.<name>.diffusers] table")
        if self.emulation and self.emulation.mechanism == "sim-account" and not self.simulated:
            raise ValueError("the 'sim-account' mechanism needs a simulated server "
                             "(emulate a simulated host)")
        return self


def model_folders(served_model_name: str) -> list[str]:
    """vLLM-Omni's folder of the served model's own code: its name lower-cased with `_` for
    every run of other characters, with and without the `_` between two digits
    (`Qwen/Qwen-Image-2.1` -> `qwen_image_21`, `qwen_image_2_1`)."""
    base = re.sub(r"[^a-z0-9]+", "_", served_model_name.rsplit("/", 1)[-1].lower()).strip("_")
    names = dict.fromkeys([re.sub(r"(\d)_(\d)", r"\1\2", base), base])
    return [f"vllm_omni/diffusion/models/{name}/" for name in names]
