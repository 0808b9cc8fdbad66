"""What a server or runner lifetime holds and leaves: its sampler, readers, host-RAM cause."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omniprobe.classify.failure_cause import host_ram_cause
from omniprobe.classify.series import decimate, unavailable
from omniprobe.config.host_entry import Host
from omniprobe.errors import HarnessError
from omniprobe.evidence.attempts import file_ref
from omniprobe.evidence.models.common import FailureCause
from omniprobe.evidence.models.runs import InitResult, TimelineSummary
from omniprobe.harness.common.emulation import (
    EmulationGuard,
)
from omniprobe.harness.common.host_memory import oom_kill_count
from omniprobe.harness.common.process import SupervisedProcess
from omniprobe.harness.common.sampler import (
    GpuReader,
    NvmlReader,
    PublishedMemoryReader,
    Sampler,
)

ReaderFactory = Callable[[Path], GpuReader]


# The file a server publishes its memory in (hosts.toml memory_file_env), in its lifetime's folder.
MEMORY_FILE = "published-memory.bin"


@dataclass(frozen=True)
class RunningLifetime:
    """A running server lifetime, as the request loop sees it."""

    server: SupervisedProcess
    init: InitResult
    index: int
    t0: float
    folder: Path
    guard: EmulationGuard | None = None
    sampler: Sampler | None = None
    oom_kills: int | None = None  # the cgroup's oom_kill count before the server started


def timeline_summary(sampler: Sampler | None, reason: str | None, hz: float,
                     artifacts_dir: Path) -> TimelineSummary:
    """A stopped sampler's summary with its series file and peak-preserving points (a lifetime
    with no sampler: why not)."""
    if sampler is None:
        return unavailable(reason or "no sampler", hz)
    summary = sampler.stop()
    return summary.model_copy(update={
        "series": file_ref(sampler.path, artifacts_dir) if sampler.path.is_file() else None,
        "points": decimate(sampler.samples)})


def default_readers(host: Host, gpu_index: int = 0) -> ReaderFactory:
    """NVML; on a host whose server publishes its memory in a file (memory_file_env), that file."""
    if host.memory_file_env:
        return lambda folder: PublishedMemoryReader(folder / MEMORY_FILE)
    return lambda folder: NvmlReader(gpu_index)


class SamplerDied(HarnessError):
    """The memory sampler ended before its server did: the lifetime's timeline is incomplete."""


def host_ram_failure(sampler: Sampler | None, oom_kills: int | None, returncode: int | None,
                     text: str, count: Callable[[], int | None] = oom_kill_count
                     ) -> FailureCause | None:
    """The host's cause of a server or runner that died of host RAM, read off the cgroup's OOM
    kills since `oom_kills` (`count`: the harness's own cgroup's, or an emulated host RAM cap's)
    and the sampler's last readings (classify/host_ram.py)."""
    after = count()
    return host_ram_cause(
        None if oom_kills is None or after is None else (oom_kills, after), returncode,
        list(sampler.host_available_mib) if sampler else None, text,
        sampler.gpu_free_mib if sampler else None)
