"""`omniprobe host add NAME --like HOST`: add this machine to hosts.toml without editing code."""

from __future__ import annotations

import argparse
import platform
import socket


def run_add(args: argparse.Namespace, nvml=None) -> int:
    from omniprobe.config.hosts import load_hosts
    from omniprobe.config.project import find_project
    from omniprobe.env.host_add import append_block, host_block, read_machine
    from omniprobe.env.nvml_facts import load_nvml, memory_total_gib

    project = find_project()
    cfg = load_hosts(project.hosts_file)
    cfg.host(args.like, "host add --like")  # an unknown host is refused before NVML is asked
    if nvml is None and platform.system() == "Linux":
        try:
            nvml = load_nvml()
        except ImportError as exc:  # read_machine refuses it by name below
            nvml = _Missing(exc)
    facts = read_machine(nvml, args.gpu_index, socket.gethostname(), platform.system(),
                         memory_total_gib())
    block = host_block(cfg, args.name, args.like, facts)
    append_block(project.hosts_file, block)
    print(f"wrote to {project.hosts_file}:\n")
    print(block.text)
    print("could not know (check these, and edit the entry where yours differ):")
    for item in block.unknown:
        print(f"  - {item}")
    print(f"next: nox -s env-{args.name} probe-init probe-serve (the report lists {args.name} "
          "as not probed yet until then)")
    return 0


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
                     help="NVML's index of the GPU to describe, on a machine with several")
    add.set_defaults(func=run_add)
