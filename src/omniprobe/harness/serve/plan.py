"""Which fixtures, flag sets and caps a serve probe runs, with what settings."""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe.config.host_entry import Host
from omniprobe.harness.common.selection import PlanError


@dataclass(frozen=True)
class ServeSettings:
    """What a serve probe runs with: the command line's options over hosts.toml's defaults."""

    port: int
    model: str
    ready_timeout_s: float
    request_timeout_s: float
    grace_s: float
    sample_hz: float = 10.0
    idle_timeout_s: float = 60.0
    poll_s: float = 0.25
    flag_sets: tuple[str, ...] = ()
    fixtures: tuple[str, ...] = ()
    max_restarts: int = 2
    cap_mib: int | None = None  # an emulated host's cap for this attempt
    gpu_index: int = 0  # NVML's index (PCI bus order): the sampler's device and the server's


def select_flag_sets(host_name: str, host: Host, wanted: tuple[str, ...]) -> list[str]:
    """The host's flag sets to run, in hosts.toml order (all of them unless some are wanted)."""
    unknown = sorted(set(wanted) - set(host.serve_flag_sets))
    if unknown:
        raise PlanError(f"flag set(s) {', '.join(unknown)} are not run on host {host_name!r} "
                       f"(its flag sets: {', '.join(host.serve_flag_sets)})")
    return [f for f in host.serve_flag_sets if not wanted or f in wanted]


