"""The simulated server's reading of its capacity model: `[capacity.<name>]` of the sim.toml
beside hosts.toml (its host, and the host it emulates, are hosts.toml's).

The file's format is defined once, by `omniprobe.config.sim_config.SimCapacity`, and the harness
validates both files with it before it starts a server. The sim reads its own table with the
standard library, as the program it stands in for reads its own config: no pydantic, so the
preflight's parse of each flag set and every server start cost an interpreter start and little
more. A test holds the two readings together (fields, defaults, values).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from omniprobe.project_files import SIM_FILE
from omniprobe.safe_io import load_toml


class CapacityError(ValueError):
    """No usable capacity model for the named host; the message says which file and where."""


@dataclass(frozen=True)
class Capacity:
    """MiB and seconds; `omniprobe.config.sim_config.SimCapacity` says what each field means."""

    vram_mib: int
    context_mib: int
    init_chunk_mib: int
    dit_mib: dict[str, int]
    encoder_mib: dict[str, int]
    activation_mib: int
    reference_mib: int
    spike_mib: int
    layerwise_mib: int
    init_s: float
    reference_s: float
    step_s: float
    kv_reference_mib: int = 0
    collapsed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SimHost:
    capacity: Capacity
    memory_file_env: str | None  # where the harness names the file to publish memory in


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked(name: str, kind: str, value: object) -> str | None:
    """Why `value` is not a `kind` (the annotation's text), or None."""
    if kind == "int":
        return None if _is_int(value) and value >= 0 else "a whole number of 0 or more"
    if kind == "float":
        good = (_is_int(value) or isinstance(value, float)) and value == value and 0 <= value < 1e9
        return None if good else "a finite number of 0 or more"
    if kind == "dict[str, int]":
        good = isinstance(value, dict) and all(_is_int(v) and v >= 0 for v in value.values())
        return None if good else "a table of precision = whole number"
    if kind == "list[str]":
        good = isinstance(value, list) and all(isinstance(v, str) for v in value)
        return None if good else "a list of strings"
    raise AssertionError(f"no check for {name}: {kind}")


def capacity_from_table(table: dict, where: str) -> Capacity:
    """The capacity model from its TOML table; CapacityError naming the field otherwise."""
    known = {f.name: f for f in dataclasses.fields(Capacity)}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise CapacityError(f"{where}: unknown key {unknown[0]!r}")
    values = {}
    for name, spec in known.items():
        if name not in table:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                raise CapacityError(f"{where}.{name}: required field is missing")
            continue
        why = _checked(name, spec.type, table[name])
        if why:
            raise CapacityError(f"{where}.{name}: expected {why}, got {table[name]!r}")
        values[name] = table[name]
    cap = Capacity(**values)
    if set(cap.dit_mib) != set(cap.encoder_mib) or "bf16" not in cap.dit_mib:
        raise CapacityError(f"{where}: dit_mib and encoder_mib must list the same precisions, "
                            "bf16 among them")
    if cap.context_mib >= cap.vram_mib:  # as SimCapacity refuses it
        raise CapacityError(f"{where}: context_mib {cap.context_mib:,} MiB must lie below "
                            f"vram_mib {cap.vram_mib:,}: the CUDA context is part of the "
                            "simulated card's memory")
    return cap


def load_sim_host(hosts_file: str | Path, name: str) -> SimHost:
    """The named simulated host's memory-file variable from hosts.toml, and its capacity model
    from the sim.toml beside it. InputError when a file cannot be read; CapacityError when the
    host has no usable model."""
    data = load_toml(hosts_file)
    hosts = data.get("hosts")
    host = hosts.get(name) if isinstance(hosts, dict) else None
    if not isinstance(host, dict):
        raise CapacityError(f"{hosts_file}: no host {name!r}")
    emulation = host.get("emulation")
    emulates = emulation.get("emulates") if isinstance(emulation, dict) else None
    # an emulated host takes the capacity model of the host it emulates, as load_hosts does
    owner = emulates if isinstance(emulates, str) else name
    sim_file = Path(hosts_file).parent / SIM_FILE
    models = load_toml(sim_file).get("capacity") if sim_file.exists() else None
    table = models.get(owner) if isinstance(models, dict) else None
    if not isinstance(table, dict):
        raise CapacityError(f"{sim_file}: no [capacity.{owner}] for host {name!r}")
    env = host.get("memory_file_env")
    if env is not None and not isinstance(env, str):
        raise CapacityError(f"{hosts_file}: hosts.{name}.memory_file_env: expected a string")
    return SimHost(capacity_from_table(table, f"{sim_file}: capacity.{owner}"), env)
