"""`omniprobe host add NAME --like HOST`: add this machine to hosts.toml without editing code."""

from __future__ import annotations

import argparse
import platform
import socket
from pathlib import Path


def run_add(args: argparse.Namespace, nvml=None) -> int:
    from omniprobe.config.hosts import load_hosts
    from omniprobe.config.project import find_project
    from omniprobe.env.host_add import append_block, host_block, read_machine
    from omniprobe.env.nvml_facts import load_nvml, memory_total_gib

    project = find_project()
    cfg = load_hosts(project.hosts_file)
    cfg.host(args.like, "host add --like")  # an unknown host is refused before NVML is asked
    if args.nvidia_smi is not None:
        return _add_card(project, cfg, args)
    if nvml is None and platform.system() == "Linux":
        try:
            nvml = load_nvml()
        except ImportError as exc:  # read_machine refuses it by name below
            nvml = _Missing(exc)
    facts = read_machine(nvml, args.gpu_index, socket.gethostname(), platform.system(),
                         memory_total_gib())
    block = host_block(cfg, args.name, args.like, facts)
    append_block(project.hosts_file, block)
    _said(project, block)
    print(f"next: nox -s env-{args.name} probe-init probe-serve (the report lists {args.name} "
          "as not probed yet until then)")
    return 0


def _add_card(project, cfg, args: argparse.Namespace) -> int:
    """--nvidia-smi FILE: the card's table from a saved reading, the machine's entry not."""
    from omniprobe.digests import sha256_bytes
    from omniprobe.env.host_add import NVIDIA_SMI_QUERY, append_block, card_block, parse_nvidia_smi
    from omniprobe.safe_io import read_bytes

    path = Path(args.nvidia_smi)
    data = read_bytes(path)
    gpu = parse_nvidia_smi(path, data.decode("utf-8", errors="replace"), args.gpu_index)
    reading = (f"nvidia-smi --query-gpu={NVIDIA_SMI_QUERY} --format=csv saved in {path.name} "
               f"(sha256 {sha256_bytes(data)[:16]}), GPU {gpu.index} of {gpu.device_count}: "
               f"memory.total {gpu.memory_total_mib} MiB (driver {gpu.driver_version})")
    block = card_block(cfg, args.name, args.like, gpu, reading)
    append_block(project.hosts_file, block)
    _said(project, block)
    print(f"next: the report judges every capacity band against card {args.name}; a host entry "
          f"for its machine comes from `omniprobe host add {args.name}-host --like {args.like}` "
          "run there")
    return 0


def _said(project, block) -> None:
    print(f"wrote to {project.hosts_file}:\n")
    print(block.text)
    print("could not know (check these, and edit the entry where yours differ):")
    for item in block.unknown:
        print(f"  - {item}")


class _Missing:
    """pynvml is not installed: every call says so, as NVML's own failure would."""

    def __init__(self, exc: ImportError):
        self.exc = exc

    def __getattr__(self, name: str):
        raise self.exc


def add_parser(sub) -> None:
    p = sub.add_parser("host", help="add this machine to hosts.toml (host add NAME --like HOST)")
    actions = p.add_subparsers(dest="host_command", required=True)
    add = actions.add_parser(
        "add", help="append a host entry and its card for this machine: its hostname, NVML's "
                    "GPU name, memory.total and compute capability, this Python, and the flag "
                    "sets of the host it is like")
    add.add_argument("name", help="the new host's name in hosts.toml (and its card's)")
    add.add_argument("--like", required=True,
                     help="the host whose flag sets (and card assumptions) it copies")
    add.add_argument("--gpu-index", type=int, default=0,
                     help="NVML's index of the GPU to describe, on a machine with several (with "
                          "--nvidia-smi: its line in the file)")
    add.add_argument("--nvidia-smi", metavar="FILE",
                     help="a saved `nvidia-smi --query-gpu=name,memory.total,compute_cap,"
                          "driver_version --format=csv` of the card, for a machine without NVML "
                          "here: writes the card's [cards.NAME] table only")
    add.set_defaults(func=run_add)
