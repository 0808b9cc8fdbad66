"""sim.toml: the simulator's own configuration, apart from hosts.toml's hosts.

omniprobe.sim stands in for vLLM-Omni on a machine without its GPU: `[capacity.<host>]` is the
capacity model the simulated host's server and offline runner run (a host emulating it takes its
model). hosts.toml says what each host is and how its runs are started; what the simulator
simulates lives here. load_hosts reads this file beside hosts.toml and hands each model to its
host; the sim reads its own table with the standard library (sim/capacity.py), and a test holds
the two readings together.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError, model_validator

from omniprobe.config.hosts_common import HostsTable, Mib, PositiveMib
from omniprobe.config.names import Name
from omniprobe.errors import InputError, Problem, problems_from_validation
from omniprobe.safe_io import toml_text


class SimCapacity(HostsTable):
    """The simulated server's capacity model (MiB and seconds); only a simulated host has one."""

    vram_mib: PositiveMib = Field(description="Memory of the modelled card.")
    context_mib: Mib = Field(description="CUDA context and other non-PyTorch memory.")
    init_chunk_mib: PositiveMib = Field(description="Size of each parameter allocation at init.")
    dit_mib: dict[str, Mib] = Field(description="Resident DiT weights by precision (bf16, ...).")
    encoder_mib: dict[str, Mib] = Field(
        description="Text-encoder weights by precision; off the GPU under --enable-cpu-offload."
    )
    activation_mib: Mib = Field(description="Working memory of every request.")
    reference_mib: Mib = Field(description="Conditioning cache per reference image.")
    spike_mib: PositiveMib = Field(description="The per-step activation spike (image MLP).")
    kv_reference_mib: Mib = Field(
        default=0, description="Of reference_mib, the conditioning KV cache that "
                               "prefix_kv_cache_dtype quantizes (fp8_v: its V half).")
    layerwise_mib: Mib = Field(description="Extra staging under --enable-layerwise-offload.")
    collapsed: list[str] = Field(default=[], description="Precisions whose outputs collapse.")
    init_s: float = Field(ge=0, description="Modelled init time.")
    reference_s: float = Field(ge=0, description="Modelled prefill time per reference.")
    step_s: float = Field(ge=0, description="Modelled time per denoise step.")

    @model_validator(mode="after")
    def _precisions_match(self) -> SimCapacity:
        if set(self.dit_mib) != set(self.encoder_mib):
            raise ValueError("dit_mib and encoder_mib must list the same precisions")
        if "bf16" not in self.dit_mib:
            raise ValueError("dit_mib needs a 'bf16' entry (the precision without --quantization)")
        if self.kv_reference_mib > self.reference_mib:
            raise ValueError("kv_reference_mib is part of reference_mib and cannot exceed it")
        if self.context_mib >= self.vram_mib:  # a card the context fills runs nothing
            raise ValueError(f"context_mib {self.context_mib:,} MiB must lie below vram_mib "
                             f"{self.vram_mib:,}: the CUDA context is part of the simulated "
                             "card's memory")
        return self


class SimConfig(HostsTable):
    capacity: dict[Name, SimCapacity] = Field(
        default={}, description="Each simulated host's capacity model, by the hosts.toml host "
                                "that runs it.")


def _toml_loc(loc) -> str:
    parts = [str(p) for p in loc]
    if len(parts) >= 2 and parts[0] == "capacity":
        return f"[capacity.{parts[1]}]" + (f" key '{'.'.join(parts[2:])}'" if len(parts) > 2 else "")
    return f"key '{'.'.join(parts)}'" if parts else ""


def parse_sim_config(path: Path, text: str | None) -> SimConfig:
    """sim.toml's text checked (None: no file, so no capacity models). InputError names every
    problem."""
    if text is None:
        return SimConfig()
    try:
        return SimConfig.model_validate(toml_text(path, text), strict=True)
    except ValidationError as exc:
        raise InputError(problems_from_validation(path, exc, _toml_loc)) from None


def model_owners(sim: SimConfig, hosts: dict) -> list[str]:
    """The hosts that take a model of sim.toml as their own."""
    return [name for name in sim.capacity if _not_a_model_owner(name, hosts.get(name)) is None]


def capacity_problems(sim: SimConfig, sim_file: Path, hosts: dict) -> list[Problem]:
    """A model for a host hosts.toml (as stated: `hosts`) lacks, or one that is not a sim host's
    own (an emulated one takes the model of the host it emulates)."""
    return [Problem(str(sim_file), f"[capacity.{name}]", why) for name in sim.capacity
            if (why := _not_a_model_owner(name, hosts.get(name)))]


def _not_a_model_owner(name: str, host: object) -> str | None:
    """Why hosts.toml's `host` (as stated) cannot have a capacity model of its own, or None."""
    if not isinstance(host, dict):
        return f"host {name!r} is not defined in hosts.toml"
    if host.get("kind") != "sim":
        return f"host {name!r} is of kind {host.get('kind')!r}; only a 'sim' host has a model"
    if host.get("emulation") is not None:
        return f"host {name!r} is emulated: it takes the model of the host it emulates"
    return None
