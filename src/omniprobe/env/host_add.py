"""`omniprobe host add`: a new [hosts.<name>] and its [cards.<name>] from this machine's facts,
its flag sets from the host it is like, appended to hosts.toml. The rest of the file stays byte
for byte; the result is loaded (every check of `validate`'s) before it is written."""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omniprobe.atomic import write_bytes_atomic
from omniprobe.config.cards import NAME_CHARS  # a card's name, as hosts.toml may hold it
from omniprobe.config.hosts import HostsConfig, parse_hosts
from omniprobe.env.nvml_facts import read_gpu
from omniprobe.errors import InputError, Problem, Refusal
from omniprobe.evidence.models.environment import GpuFacts
from omniprobe.limits import MAX_MIB
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
        gpu = gpu.model_copy(update={"name": clean_name(gpu.name)})
    except HostAddRefused:
        raise
    except Exception as exc:  # NVML raises its own classes, or the library is missing
        raise HostAddRefused(
            f"host add: NVML cannot read a GPU on this machine ({type(exc).__name__}: {exc}); "
            "nothing written. Either run it on the machine with the GPU (NVML's Python "
            "binding: pip install nvidia-ml-py), or save that machine's `nvidia-smi "
            f"--query-gpu={NVIDIA_SMI_QUERY} --format=csv` to a file and pass it with "
            "--nvidia-smi FILE, which writes the card's table only") from None
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


# The columns `host add --nvidia-smi` reads, as nvidia-smi's --query-gpu names them.
NVIDIA_SMI_QUERY = "name,memory.total,compute_cap,driver_version"


def parse_nvidia_smi(path: Path, text: str, gpu_index: int) -> GpuFacts:
    """One GPU of a saved `nvidia-smi --query-gpu=NVIDIA_SMI_QUERY --format=csv` output (its
    header line, then a line per GPU); InputError naming the file, the line and what was
    expected."""
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    rows = [row for row in rows if any(cell.strip() for cell in row)]

    def wrong(line: int, what: str) -> InputError:
        return InputError([Problem(str(path), f"line {line}", what)])

    if not rows:
        raise wrong(1, f"empty: expected nvidia-smi --query-gpu={NVIDIA_SMI_QUERY} "
                       "--format=csv output, its header first")
    header = [cell.split(" [")[0].strip() for cell in rows[0]]
    missing = [col for col in NVIDIA_SMI_QUERY.split(",") if col not in header]
    if missing:
        raise wrong(1, f"the header lacks {', '.join(missing)}: expected the output of "
                       f"nvidia-smi --query-gpu={NVIDIA_SMI_QUERY} --format=csv")
    gpus = rows[1:]
    if not 0 <= gpu_index < len(gpus):
        raise wrong(2 + gpu_index, f"--gpu-index {gpu_index}: the file lists {len(gpus)} GPU(s)")
    row = dict(zip(header, gpus[gpu_index], strict=False))
    line = 2 + gpu_index
    memory = re.fullmatch(r"(\d+) MiB", (row.get("memory.total") or "").strip())
    if memory is None or not 0 < int(memory[1]) <= MAX_MIB:
        raise wrong(line, f"memory.total {row.get('memory.total')!r}: expected '<MiB> MiB', as "
                          "nvidia-smi writes it")
    capability = (row.get("compute_cap") or "").strip()
    if re.fullmatch(r"\d+\.\d+", capability) is None:
        raise wrong(line, f"compute_cap {capability!r}: expected major.minor, e.g. 8.6")
    name = clean_name(row.get("name") or "")
    driver = clean_name(row.get("driver_version") or "")
    if not name or not driver:
        raise wrong(line, f"{'name' if not name else 'driver_version'}: empty, expected what "
                          "nvidia-smi writes there")
    return GpuFacts(index=gpu_index, device_count=len(gpus), name=name,
                    memory_total_mib=int(memory[1]), compute_capability=capability,
                    driver_version=driver)


def card_block(cfg: HostsConfig, name: str, like: str, gpu: GpuFacts, reading: str) -> HostBlock:
    """The [cards.<name>] table alone, from a saved nvidia-smi reading (`reading`: where it
    comes from), its assumptions copied from host `like`'s card: what belongs to the machine
    (hostname, Python, host RAM) is not known from the file and not written."""
    _, card, copied = _model_card(cfg, name, like)
    lines, unknown = _card_lines(name, gpu, reading, card, copied, like)
    return HostBlock("\n".join([f"# Written by `omniprobe host add {name} --like {like} "
                                "--nvidia-smi` from a saved nvidia-smi reading.", *lines]) + "\n",
                     unknown + ["the host entry: a card's file says nothing of its machine "
                                "(hostname, Python, host RAM); run `omniprobe host add` on "
                                "that machine for one"])


def _model_card(cfg: HostsConfig, name: str, like: str):
    """Host `like` and its card, whose assumptions a new card copies; HostAddRefused where the
    name is taken or `like` has no real card to copy."""
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
    return model, cfg.cards[model.card], (f"copied by omniprobe host add from the card of "
                                          f"host {like} ({model.card}), ")


def _vram_gb(gpu: GpuFacts) -> int:
    """A card's marketed size, as host add writes it: NVML's memory.total rounded to GiB."""
    return max(1, round(gpu.memory_total_mib / 1024))


def _card_lines(name: str, gpu: GpuFacts, reading: str, card, copied: str,
                like: str) -> tuple[list[str], list[str]]:
    vram_gb = _vram_gb(gpu)
    lines = [
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
    unknown = [f"vram_gb: the marketed size; {vram_gb} is NVML's memory.total rounded to GiB",
               f"overhead_mib ({card.overhead_mib}): an assumption copied from host {like}'s "
               "card, not measured on this card",
               f"other_processes_mib ({card.other_processes_mib}): an assumption copied from "
               f"host {like}'s card; what this machine's other programs hold on the card"]
    return lines, unknown


def host_block(cfg: HostsConfig, name: str, like: str, facts: MachineFacts) -> HostBlock:
    """The [hosts.<name>] and [cards.<name>] tables for this machine, like host `like`;
    HostAddRefused where the name is taken or `like` has nothing to copy."""
    model, card, copied = _model_card(cfg, name, like)
    gpu = facts.gpu
    vram_gb = _vram_gb(gpu)
    reading = (f"NVML on {facts.hostname}, GPU {gpu.index} of {gpu.device_count}: "
               f"memory.total {gpu.memory_total_mib} MiB (driver {gpu.driver_version})")
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
    unknown = []
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
    card_lines, card_unknown = _card_lines(name, gpu, reading, card, copied, like)
    return HostBlock("\n".join([*lines, "", *card_lines]) + "\n", card_unknown + unknown)


def _real_study_hosts(cfg: HostsConfig) -> list[str]:
    return [k for k, h in cfg.hosts.items()
            if not h.simulated and h.emulation is None and h.diffusers is None]


def append_block(hosts_file: Path, block: HostBlock) -> bytes:
    """hosts.toml with the block appended: loaded with every check first, then written
    atomically; the existing bytes are kept as they are. Two at once take turns (a lock on the
    project's folder, read to write), so neither loses the other's entry; a hosts.toml that is a
    symbolic link (a shared file elsewhere) is refused, never written through. Returns the new
    file's bytes."""
    if hosts_file.is_symlink():
        raise HostAddRefused(f"host add: {hosts_file} is a symbolic link (to "
                             f"{os.readlink(hosts_file)}): host add writes the project's own "
                             "file, never through a link; nothing written")
    folder = os.open(hosts_file.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        before = read_bytes(hosts_file)
        gap = b"" if before.endswith(b"\n\n") else (b"\n" if before.endswith(b"\n") else b"\n\n")
        after = before + gap + block.text.encode("utf-8")
        parse_hosts(hosts_file, after.decode("utf-8"))  # an InputError here writes nothing
        write_bytes_atomic(hosts_file, after)
    finally:
        os.close(folder)  # the lock goes with the descriptor
    return after


def clean_name(name: str) -> str:
    """One line of printable characters (no control or bidi characters), at most NAME_CHARS."""
    return " ".join("".join(c if c.isprintable() else " " for c in name).split())[:NAME_CHARS]
