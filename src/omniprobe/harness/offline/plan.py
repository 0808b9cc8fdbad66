"""Which entries, fixtures and seeds probe-offline runs, with what settings."""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe.config.fixtures import Fixture
from omniprobe.config.host_entry import Host
from omniprobe.harness.common.selection import PlanError


class KwargSetNotRunnable(PlanError):
    """An offline kwarg set (or profile) the host does not run, or whose kwargs the source does
    not state."""


@dataclass(frozen=True)
class OfflineSettings:
    """What probe-offline runs with: the command line's options over hosts.toml's defaults."""

    model: str
    ready_timeout_s: float
    request_timeout_s: float
    grace_s: float
    idle_timeout_s: float = 60.0
    poll_s: float = 0.02  # the runner's results file: a read of what it appended, if anything
    configurations: tuple[str, ...] = ()  # the kwarg sets or profiles asked for (): all
    fixtures: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()
    max_restarts: int = 2
    sample_hz: float = 10.0
    cap_mib: int | None = None  # an emulated host's cap for this attempt
    gpu_index: int = 0  # NVML's index: the runner's device (CUDA_VISIBLE_DEVICES), as sampled
    host_ram_mib: int | None = None  # an emulated host's host RAM, capped by a cgroup


@dataclass(frozen=True)
class PlannedRequest:
    fixture: Fixture
    seed: int

    @property
    def id(self) -> str:
        return f"{self.fixture.id}-{self.seed}"


def host_ram_mib(host: Host | None) -> int | None:
    ram = host.emulation.host_ram_gib if host is not None and host.emulation else None
    return None if ram is None else round(ram * 1024)
