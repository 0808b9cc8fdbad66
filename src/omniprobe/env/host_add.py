"""`omniprobe host add`: a new [hosts.<name>] and its [cards.<name>] from this machine's facts,
its flag sets from the host it is like, appended to hosts.toml. The rest of the file stays byte
for byte; the result is loaded (every check of `validate`'s) before it is written."""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omniprobe.atomic import write_bytes_atomic
from omniprobe.config.hosts import HostsConfig, parse_hosts
from omniprobe.env.nvml_facts import read_gpu
from omniprobe.errors import Refusal
from omniprobe.evidence.models.environment import GpuFacts
from omniprobe.safe_io import read_bytes


class HostAddRefused(Refusal):
    """This machine cannot run the probes, or hosts.toml cannot take the entry as asked."""


@dataclass(frozen=True)
class MachineFacts:
    """What `host add` reads off this machine."""

    hostname: str
    system: str  # platform.system(): the probes run on Linux only
    python: str  # e.g. "CPython 3.13.1 (/usr/bin/python3)"
    host_ram_gib: float | None
    gpu: GpuFacts


@dataclass(frozen=True)
class HostBlock:
    text: str  # the TOML appended to hosts.toml
    unknown: list[str]  # what it could not know, for the user to fill in


def this_python() -> str:
    return f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})"


def read_machine(nvml: Any, gpu_index: int, hostname: str, system: str,
                 host_ram_gib: float | None) -> MachineFacts:
    """This machine's facts; HostAddRefused where it cannot run the probes (no Linux, no NVML,
    no GPU at `gpu_index`)."""
    if system != "Linux":
        raise HostAddRefused(f"host add: this machine runs {system}, and the probes run on Linux "
                             "only (the server's process tree, cgroups, /proc); nothing written")
    try:
        count = _device_count(nvml)
        if not 0 <= gpu_index < count:
            raise HostAddRefused(f"host add: --gpu-index {gpu_index}: NVML sees {count} GPU(s), "
                                 f"indices 0..{count - 1}; nothing written")
        gpu = read_gpu(nvml, gpu_index)
    except HostAddRefused:
        raise
    except Exception as exc:  # NVML raises its own classes, or the library is missing
        raise HostAddRefused(f"host add: NVML cannot read a GPU on this machine "
                             f"({type(exc).__name__}: {exc}); the probes measure the card "
                             "through NVML; nothing written") from None
    return MachineFacts(hostname, system, this_python(), host_ram_gib, gpu)


def _device_count(nvml: Any) -> int:
    nvml.nvmlInit()
    try:
        return int(nvml.nvmlDeviceGetCount())
    finally:
        nvml.nvmlShutdown()


def _toml(value: Any) -> str:
    """A TOML value: JSON's strings, numbers and arrays are TOML's too (ASCII escapes)."""
    return json.dumps(value)


def _line(key: str, value: Any) -> str:
    return f"{key} = {_toml(value)}"


def _source(kind: str, where: str) -> str:
    return f"{{ kind = {_toml(kind)}, where = {_toml(where)} }}"


def host_block(cfg: HostsConfig, name: str, like: str, facts: MachineFacts) -> HostBlock:
    """The [hosts.<name>] and [cards.<name>] tables for this machine, like host `like`;
    HostAddRefused where the name is taken or `like` has nothing to copy."""
    if name in cfg.hosts or name in cfg.cards:
        taken = "[hosts]" if name in cfg.hosts else "[cards]"
        raise HostAddRefused(f"host add: {name!r} is already in hosts.toml's {taken}; pick "
                             "another NAME; nothing written")
    model = cfg.host(like, "host add --like")
    if model.simulated or model.emulation is not None or model.diffusers is not None:
        raise HostAddRefused(f"host add --like {like}: a simulated, emulated or Diffusers host "
                             "has no real card's flag sets to copy; like one of: "
                             f"{', '.join(_real_study_hosts(cfg)) or 'none'}; nothing written")
    if model.card is None or model.card not in cfg.cards:
        raise HostAddRefused(f"host add --like {like}: that host names no [cards] entry to take "
                             "the overhead and other-processes assumptions from; nothing written")
    card = cfg.cards[model.card]
    gpu = facts.gpu
    vram_gb = max(1, round(gpu.memory_total_mib / 1024))
    reading = (f"NVML on {facts.hostname}, GPU {gpu.index} of {gpu.device_count}: "
               f"memory.total {gpu.memory_total_mib} MiB (driver {gpu.driver_version})")
    copied = f"copied by omniprobe host add from the card of host {like} ({model.card}), "
    lines = [
        f"# Written by `omniprobe host add {name} --like {like}` from this machine's facts.",
        f"[hosts.{name}]",
        _line("kind", model.kind),
        _line("name", gpu.name),
        _line("card", name),
        _line("hostname", facts.hostname),
        _line("gpu", gpu.name),
        _line("compute_capability", gpu.compute_capability),
        f"{_line('vram_gb', vram_gb)}  # NVML's memory.total in GiB, rounded; the marketed "
        "figure may differ",
    ]
    unknown = [f"vram_gb: the marketed size; {vram_gb} is NVML's memory.total rounded to GiB"]
    if facts.host_ram_gib is None:
        unknown.append("host_ram_gib: /proc/meminfo could not be read; not stated")
    else:
        lines.append(_line("host_ram_gib", facts.host_ram_gib))
        lines.append(_line("host_ram_note", "MemTotal from /proc/meminfo"))
    lines += [
        _line("python_provider", facts.python),
        _line("idle_tolerance_mib", model.idle_tolerance_mib),
        _line("serve_flag_sets", model.serve_flag_sets),
    ]
    if model.offline_kwarg_sets:
        lines.append(_line("offline_kwarg_sets", model.offline_kwarg_sets))
    unknown.append(f"serve_flag_sets and offline_kwarg_sets: copied from {like}; whether each "
                   "fits this card is what the probes find out")
    lines += [
        "",
        f"[cards.{name}]",
        _line("name", gpu.name),
        _line("vram_gb", vram_gb),
        _line("memory_total_mib", gpu.memory_total_mib),
        f"memory_total_source = {_source('nvml', reading)}",
        _line("overhead_mib", card.overhead_mib),
        f"overhead_source = {_source('assumed', copied + 'not measured on this card')}",
        _line("other_processes_mib", card.other_processes_mib),
        "other_processes_source = "
        f"{_source('assumed', copied + 'set it to what your desktop holds on the card')}",
    ]
    unknown += [f"overhead_mib ({card.overhead_mib}): an assumption copied from {model.card}, "
                "not measured on this card",
                f"other_processes_mib ({card.other_processes_mib}): an assumption copied from "
                f"{model.card}; what this machine's other programs hold on the card"]
    return HostBlock("\n".join(lines) + "\n", unknown)


def _real_study_hosts(cfg: HostsConfig) -> list[str]:
    return [k for k, h in cfg.hosts.items()
            if not h.simulated and h.emulation is None and h.diffusers is None]


def append_block(hosts_file: Path, block: HostBlock) -> bytes:
    """hosts.toml with the block appended: loaded with every check first, then written
    atomically; the existing bytes are kept as they are. Returns the new file's bytes."""
    before = read_bytes(hosts_file)
    gap = b"" if before.endswith(b"\n\n") else (b"\n" if before.endswith(b"\n") else b"\n\n")
    after = before + gap + block.text.encode("utf-8")
    parse_hosts(hosts_file, after.decode("utf-8"))  # an InputError here writes nothing
    write_bytes_atomic(hosts_file, after)
    return after
