"""What an attempt's figures must agree with beyond one record: memory peaks within the GPU the
attempt ran on, request walls within the timeout that was in force. Each bound is stated in the
error. Each check is a small function of (attempt, its bounds); ATTEMPT_CHECKS lists them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from omniprobe.config.host_entry import Host
from omniprobe.errors import Problem
from omniprobe.evidence.load import Evidence, LoadedAttempt
from omniprobe.evidence.migrations import content_path

# A wall is the time to the answer's last byte; the timeout bounds each wait for the server, and
# a large image's transfer over loopback takes well under this on top.
WALL_MARGIN_S = 30.0


@dataclass(frozen=True)
class Bounds:
    """The physical limits an attempt's figures must lie within, and where each comes from."""

    memory_mib: float
    memory_source: str

    def memory_text(self) -> str:
        return f"{self.memory_mib:,.0f} MiB ({self.memory_source})"


def memory_bound(attempt: LoadedAttempt, host: Host, evidence: Evidence) -> Bounds:
    """The memory of the GPU the attempt ran on: the cap a simulated account took as its total,
    the simulated card's, NVML's total where the attempt's env manifest records it, else the
    host's vram_gb read as GiB (a card marketed as 24 GB holds 24 GiB: the seed's 3090 reached
    24,137 MiB)."""
    prov = attempt.meta.provenance
    if prov.kind == "emulated" and prov.mechanism == "sim-account":
        return Bounds(prov.cap_mib, "the emulated cap the simulated account took as its total")
    if host.capacity is not None and host.emulation is None:
        return Bounds(host.capacity.vram_mib, "the simulated card's [capacity] vram_mib")
    manifest_id = attempt.meta.environment.manifest if attempt.meta.environment else None
    if manifest_id is not None:
        env = next((a.environment for a in evidence.attempts if a.id == manifest_id), None)
        gpu = env.host_facts.gpu if env is not None else None
        if gpu is not None:
            return Bounds(gpu.memory_total_mib, f"NVML's total in manifest {manifest_id}")
    return Bounds(host.vram_gb * 1024, f"vram_gb {host.vram_gb} of hosts.toml, read as GiB")


Found = Iterator[tuple[str, str, str]]  # (file, JSON path in its content, message)


def peaks_within_memory(attempt: LoadedAttempt, bounds: Bounds) -> Found:
    """No memory figure exceeds the GPU's memory (peaks are non-negative by their models)."""
    def over(value: float | None) -> bool:
        return value is not None and value > bounds.memory_mib

    def say(value: float) -> str:
        return f"{value:,.1f} MiB exceeds the GPU's memory, {bounds.memory_text()}"

    for i, run in enumerate(attempt.runs):
        if over(run.gpu_peak_mib):
            yield "runs.json", f"$[{i}].gpu_peak_mib", say(run.gpu_peak_mib)
        for j, cell in enumerate(run.cells):
            if cell.server_peak_mb is not None and over(cell.server_peak_mb.max):
                yield "runs.json", f"$[{i}].cells[{j}].server_peak_mb.max", say(
                    cell.server_peak_mb.max)
        for j, lifetime in enumerate(run.lifetimes):
            timeline = lifetime.timeline
            for name in ("peak_mib", "device_peak_mib"):
                value = getattr(timeline, name) if timeline else None
                if over(value):
                    yield "runs.json", f"$[{i}].lifetimes[{j}].timeline.{name}", say(value)
    for i, record in enumerate(attempt.requests):
        if over(record.server_peak_mb):
            yield "requests.json", f"$[{i}].server_peak_mb", say(record.server_peak_mb)
    for i, record in enumerate(attempt.offline_requests):
        if over(record.peak_mib):
            yield "offline-requests.json", f"$[{i}].peak_mib", say(record.peak_mib)


def walls_within_timeout(attempt: LoadedAttempt, bounds: Bounds) -> Found:
    """A request's wall is bounded by the request timeout of its server lifetime, where the
    lifetime records it (the models bound every wall by a week, the longest timeout)."""
    lifetimes = {run.flag_set: run.lifetimes for run in attempt.runs}
    for i, record in enumerate(attempt.requests):
        runs = lifetimes.get(record.flag_set, [])
        if record.lifetime is None or record.lifetime >= len(runs):
            continue
        timeout = runs[record.lifetime].request_timeout_s
        if timeout is not None and record.wall_s > timeout + WALL_MARGIN_S:
            yield "requests.json", f"$[{i}].wall_s", (
                f"{record.wall_s:g} s exceeds the request timeout in force, {timeout:g} s (its "
                f"server lifetime {record.lifetime}), plus {WALL_MARGIN_S:g} s for the answer")


ATTEMPT_CHECKS: tuple[Callable[[LoadedAttempt, Bounds], Found], ...] = (
    peaks_within_memory, walls_within_timeout)


def consistency_problems(attempt: LoadedAttempt, host: Host, evidence: Evidence) -> list[Problem]:
    bounds = memory_bound(attempt, host, evidence)
    return [Problem(str(attempt.path / file), content_path(file, path), message)
            for check in ATTEMPT_CHECKS for file, path, message in check(attempt, bounds)]
