"""One supervised lifetime of a server or an offline runner, the same for both probes: the idle
wait, the emulation guard, the sampler and its timeline, the redacted log, the host-RAM cause of
a death, and the group stopped on every exit path (Lifetimes.run); and what it leaves."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from omniprobe.classify.failure_cause import host_ram_cause
from omniprobe.classify.series import decimate, unavailable
from omniprobe.config.host_entry import Host
from omniprobe.errors import HarnessError
from omniprobe.evidence.attempts import file_ref
from omniprobe.evidence.models.common import ArtifactRef, FailureCause
from omniprobe.evidence.models.runs import TimelineSummary
from omniprobe.harness.common.emulation import (
    EmulationGuard,
    EmulationUnguarded,
    capped_processes,
    emulation_env,
)
from omniprobe.harness.common.host_memory import oom_kill_count
from omniprobe.harness.common.logs import read_from
from omniprobe.harness.common.process import Endpoints, SupervisedProcess
from omniprobe.harness.common.sampler import (
    MIB,
    GpuReader,
    IdleReading,
    NvmlReader,
    NvmlUnavailable,
    PublishedMemoryReader,
    Sampler,
    idle_reading,
)
from omniprobe.redaction import redact_file

ReaderFactory = Callable[[Path], GpuReader]


# The file a server publishes its memory in (hosts.toml memory_file_env), in its lifetime's folder.
MEMORY_FILE = "published-memory.bin"


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


# How often a GPU that is not idle yet is read again before a lifetime starts.
IDLE_POLL_S = 0.25


class LifetimeSettings(Protocol):
    """What a probe's settings (ServeSettings, OfflineSettings) give every lifetime."""

    grace_s: float
    sample_hz: float
    idle_timeout_s: float
    cap_mib: int | None  # an emulated host's cap for this attempt
    gpu_index: int  # NVML's index (PCI bus order): the sampler's device and the process's


@dataclass(frozen=True)
class ProcessSpec:
    """One supervised process: what runs, and what the lifetime says of it.

    `env`: the process's own environment, before the lifetime adds the sampled device, the
    published-memory file and an emulated cap. `endpoints`: what "ready" means for a server
    (SupervisedProcess.wait_ready); None for a runner, whose protocol says it. `label` and
    `name` name it in errors ("[fp8] ... server lifetime 0"). `redact`: files the process wrote
    besides its log, kept as artifacts. `last_sample`: one sample before the stop, for a server
    the harness stops while it still holds its memory (a runner ends on its own first).
    `oom_kills`: the cgroup count of the kernel's OOM kills that a host-RAM death is read off;
    `fresh_cgroup`: that cgroup was made for this process, so it has killed nothing yet."""

    command: list[str]
    env: dict[str, str]
    log_path: Path
    role: str  # "server" or "runner"
    label: str
    name: str
    endpoints: Endpoints | None = None
    redact: tuple[Path, ...] = ()
    last_sample: bool = False
    oom_kills: Callable[[], int | None] = oom_kill_count
    fresh_cgroup: bool = False

    @property
    def folder(self) -> Path:
        return self.log_path.parent


@dataclass(frozen=True)
class Running:
    """A started lifetime, as the caller's loop sees it: the process, its clock's origin (one for
    the init time, the series and the requests), its guard and sampler."""

    process: SupervisedProcess
    started_at: datetime
    guard: EmulationGuard | None
    sampler: Sampler | None
    oom_kills: int | None  # the cgroup's count before the process started
    count: Callable[[], int | None]

    @property
    def t0(self) -> float:
        return self.process.started

    def host_ram(self, returncode: int | None, text: str) -> FailureCause | None:
        """The host's cause of the process's death, if the kernel killed it for host RAM."""
        return host_ram_failure(self.sampler, self.oom_kills, returncode, text, count=self.count)


@dataclass(frozen=True)
class Ended:
    """What a lifetime left, for its record: how the process ended, its timeline (the emulation
    check in it), its redacted log, and the GPU's idle reading before it started."""

    ended: str
    timeline: TimelineSummary
    log: ArtifactRef
    idle: IdleReading | None


class Lifetimes:
    """One probe's supervised lifetimes, one at a time on one GPU of one host: each waits for the
    GPU to go idle, refuses an emulated cap it cannot guard, starts its process in its own group
    (SupervisedProcess), samples it, and on every exit path stops the group, ends the series,
    checks the cap, redacts the logs and hands what it left to the caller's record before a cut
    series fails the run (SamplerDied)."""

    def __init__(self, host_name: str, host: Host, settings: LifetimeSettings,
                 readers: ReaderFactory, artifacts_dir: Path):
        self.host_name, self.host, self.settings = host_name, host, settings
        self.readers, self.artifacts_dir = readers, artifacts_dir
        self.first_idle: int | None = None  # the first idle reading: later ones are held to it

    def _reader(self, folder: Path) -> tuple[GpuReader | None, str | None]:
        try:
            return self.readers(folder), None
        except NvmlUnavailable as exc:
            return None, str(exc)

    def _idle(self, reader: GpuReader | None) -> IdleReading | None:
        if reader is None:
            return None
        idle = idle_reading(reader, self.first_idle, timeout_s=self.settings.idle_timeout_s,
                            tolerance_mib=self.host.idle_tolerance_mib, poll_s=IDLE_POLL_S)
        self.first_idle = idle.first_idle
        return idle

    def _env(self, spec: ProcessSpec) -> tuple[dict[str, str], EmulationGuard | None]:
        env = dict(spec.env)
        if self.host.memory_file_env:
            env[self.host.memory_file_env] = str(spec.folder / MEMORY_FILE)
        # The process runs on the device the sampler watches (--gpu-index; CUDA numbers the GPUs
        # in PCI bus order, as NVML does: server_env).
        env["CUDA_VISIBLE_DEVICES"] = str(self.settings.gpu_index)
        cap = self.settings.cap_mib
        if cap is None:
            return env, None
        env.update(emulation_env(self.host, cap, env))
        return env, EmulationGuard(cap, None if self.first_idle is None else self.first_idle / MIB)

    @contextmanager
    def run(self, spec: ProcessSpec, record: Callable[[Ended], None]) -> Iterator[Running]:
        """One lifetime of `spec`; `record` keeps what it left, on every exit path once the
        process has started."""
        spec.folder.mkdir(parents=True, exist_ok=True)
        reader, reason = self._reader(spec.folder)
        if self.settings.cap_mib is not None and reader is None:
            raise EmulationUnguarded(f"host {self.host_name!r} is emulated, but its {spec.role}'s "
                                     f"memory cannot be sampled to check the cap: {reason}")
        idle = self._idle(reader)
        env, guard = self._env(spec)
        process = SupervisedProcess(spec.command, env, spec.log_path, spec.endpoints,
                                    grace_s=self.settings.grace_s,
                                    model_code=tuple(self.host.model_code))
        started_at = datetime.now(UTC)
        oom_kills = 0 if spec.fresh_cgroup else spec.oom_kills()
        sampler = None
        finished = False
        process.start()
        try:
            if reader is not None:
                sampler = Sampler(reader, spec.folder / "timeline.jsonl",
                                  hz=self.settings.sample_hz, root_pid=lambda: process.pid,
                                  t0=process.started, guard=guard)
                sampler.start()
            yield Running(process, started_at, guard, sampler, oom_kills, spec.oom_kills)
            finished = True
        finally:
            if sampler is not None and spec.last_sample:
                sampler.sample_now()
            ended = process.stop()
            timeline = timeline_summary(sampler, reason, self.settings.sample_hz,
                                        self.artifacts_dir)
            if guard is not None:
                capped = capped_processes(read_from(spec.log_path))
                timeline = timeline.model_copy(update={"emulation": guard.check(capped)})
            redact_file(spec.log_path, *spec.redact)
            record(Ended(ended, timeline, file_ref(spec.log_path, self.artifacts_dir), idle))
            if finished and timeline.state == "incomplete":
                # Recorded as incomplete first; a peak read off a cut series would be a wrong one.
                # Only a lifetime that ended on its own fails for it (another exception in flight
                # says more).
                raise SamplerDied(f"[{spec.label}] {timeline.reason}; the timeline of "
                                  f"{spec.name} is recorded as incomplete (re-run to resume)")
