"""GPU memory through NVML: a background sampler of one server's memory, and the idle check.

The NVML layer is a small reader interface, so tests and the sim host swap it: `NvmlReader`
wraps pynvml (or any module with its API, such as `fakenvml`), `PublishedMemoryReader` reads the
memory a server publishes in a file where NVML cannot see it (a host with hosts.toml
`memory_file_env`: the simulated one). Samples go to a JSONL file as they are taken.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from omniprobe.classify.series import Sample, summarise
from omniprobe.errors import EnvironmentFailure
from omniprobe.evidence.models.runs import TimelineSummary
from omniprobe.harness.common.host_memory import available_mib
from omniprobe.harness.common.interrupt import pause
from omniprobe.harness.common.processes import alive

MIB = 1024**2
# What a server publishes in its memory file: pid, used bytes, total bytes (little-endian int64s).
# pid, used bytes, total bytes, peak bytes since the server started (omniprobe.sim's StateFile).
PUBLISHED_MEMORY = struct.Struct("<qqqq")


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    used: int | None  # bytes; None where NVML cannot tell (e.g. some containers)


class NvmlUnavailable(EnvironmentFailure):
    """No NVML here (no driver, no GPU); the probe records that instead of crashing."""


class GpuReader(Protocol):
    label: str

    def memory(self) -> tuple[int, int]:
        """(used, total) bytes of the device."""

    def processes(self) -> tuple[list[ProcessMemory], list[ProcessMemory]]:
        """The compute and the graphics running-process lists."""

    def process_name(self, pid: int) -> str: ...


class NvmlReader:
    def __init__(self, index: int = 0, nvml=None):
        self.label = f"NVML device {index}"  # the one the server runs on (CUDA_VISIBLE_DEVICES)
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as exc:
                raise NvmlUnavailable(f"pynvml is not installed ({exc})") from None
        self._nvml = nvml
        try:
            nvml.nvmlInit()
            self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML: {exc}") from None

    def memory(self) -> tuple[int, int]:
        info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        return info.used, info.total

    def processes(self) -> tuple[list[ProcessMemory], list[ProcessMemory]]:
        nvml = self._nvml
        lists = (nvml.nvmlDeviceGetComputeRunningProcesses(self._handle),
                 nvml.nvmlDeviceGetGraphicsRunningProcesses(self._handle))
        return tuple([ProcessMemory(p.pid, p.usedGpuMemory) for p in found] for found in lists)

    def process_name(self, pid: int) -> str:
        try:
            name = self._nvml.nvmlSystemGetProcessName(pid)
        except self._nvml.NVMLError:
            return _proc_name(pid)
        return name.decode() if isinstance(name, bytes) else name


def read_published_memory(path: Path) -> tuple[int, int, int, int] | None:
    """(pid, used, total, peak bytes) as the server last published them; None before it has."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(PUBLISHED_MEMORY.size)
    except FileNotFoundError:
        return None
    return PUBLISHED_MEMORY.unpack(data) if len(data) == PUBLISHED_MEMORY.size else None


class PublishedMemoryReader:
    """The memory a server publishes in a file (PUBLISHED_MEMORY), read the way NVML would
    report it: nothing in use until a live server has published. A sample reads the server's new
    peak, where it rose since the previous sample: memory a request held between two samples
    still shows, as it does to NVML on a real server, whose caching allocator keeps freed memory
    reserved. `processes` reports what the last `memory` read."""

    label = "memory the server publishes"

    def __init__(self, path: Path):
        self.path = path
        self._seen_peak = 0
        self._last: tuple[int, int] | None = None

    def _state(self) -> tuple[int, int, int, int] | None:
        state = read_published_memory(self.path)
        return state if state is not None and alive(state[0]) else None

    def memory(self) -> tuple[int, int]:
        state = self._state()
        if state is None:
            self._last = None
            return 0, 0
        pid, used, total, peak = state
        if peak > self._seen_peak:
            used, self._seen_peak = max(used, peak), peak
        self._last = (pid, used)
        return used, total

    def processes(self) -> tuple[list[ProcessMemory], list[ProcessMemory]]:
        if self._last is None:
            self.memory()
        return ([ProcessMemory(*self._last)] if self._last else []), []

    def process_name(self, pid: int) -> str:
        return _proc_name(pid)


def _proc_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "not visible from here"


def parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    return int(stat[stat.rindex(")") + 2:].split()[1])


def descends_from(pid: int, root: int) -> bool:
    """Whether pid is root or one of its descendants (Linux /proc; false for unseen pids)."""
    seen = set()
    while pid and pid not in seen:
        if pid == root:
            return True
        seen.add(pid)
        pid = parent_pid(pid)
    return False


def unique_processes(*lists: Iterable[ProcessMemory]) -> dict[int, int | None]:
    """pid -> memory, each process once: NVML may list a pid as both compute and graphics."""
    found: dict[int, int | None] = {}
    for listed in lists:
        for proc in listed:
            found.setdefault(proc.pid, proc.used)
    return found


def tree_memory(compute: list[ProcessMemory], graphics: list[ProcessMemory],
                pids: set[int]) -> int | None:
    """Bytes held by the given processes; None when none is listed or a size is unknown."""
    mine = {pid: used for pid, used in unique_processes(compute, graphics).items() if pid in pids}
    if not mine or None in mine.values():
        return None
    return sum(mine.values())


class SampleObserver(Protocol):
    def observe(self, sample: Sample) -> None: ...


# The host's available memory of the last this many samples is kept: what a process the kernel
# killed left behind (classify/host_ram.py), some 2 s at 10 Hz.
HOST_READINGS = 20


class Sampler:
    """Samples a reader at `hz` in a thread, appending each sample to a JSONL file at once, and
    hands each to the guard (an emulated host's EmulationGuard), if any. Beside each sample it
    reads the host's available memory (`host_memory`), and keeps the last HOST_READINGS of them
    and the GPU's free memory at the last sample, for the cause of a process that dies."""

    def __init__(self, reader: GpuReader, path: Path, *, hz: float = 10.0,
                 root_pid: Callable[[], int | None] = lambda: None, t0: float | None = None,
                 guard: SampleObserver | None = None,
                 host_memory: Callable[[], float | None] | None = None):
        self.reader, self.path, self.hz = reader, path, hz
        self.guard = guard
        self.host_memory = host_memory or available_mib
        self.host_available_mib: deque[float] = deque(maxlen=HOST_READINGS)
        self.gpu_free_mib: float | None = None
        self.root_pid = root_pid
        self.t0 = time.monotonic() if t0 is None else t0
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._owned: dict[tuple[int, int], bool] = {}  # a pid's ancestry is looked up once
        self.error: str | None = None
        self.died: str | None = None  # why the thread ended before stop(): the series is cut
        self._written = 0  # lines in the series file
        self._lock = threading.Lock()  # the thread's samples and `sample_now`'s, one at a time
        self._out: TextIO | None = None

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def stop(self) -> TimelineSummary:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.summary()

    def summary(self) -> TimelineSummary:
        summary = summarise(self.samples, self.hz, self.reader.label)
        if self.died:
            return summary.model_copy(update={"state": "incomplete", "reason": self.died})
        if self.error:
            summary = summary.model_copy(update={"reason": self.error})
        return summary

    def _mine(self, pid: int) -> bool:
        root = self.root_pid()
        if root is None:
            return False
        if (pid, root) not in self._owned:
            self._owned[pid, root] = descends_from(pid, root)
        return self._owned[pid, root]

    def sample(self) -> Sample:
        now = time.monotonic()
        used, total = self.reader.memory()
        self.gpu_free_mib = (total - used) / MIB if total else None
        host = self.host_memory()
        if host is not None:
            self.host_available_mib.append(host)
        compute, graphics = self.reader.processes()
        mine = {pid for pid in unique_processes(compute, graphics) if self._mine(pid)}
        owned = tree_memory(compute, graphics, mine)
        return Sample(t_s=now - self.t0, device_mib=used / MIB,
                      process_mib=None if owned is None else owned / MIB)

    def sample_now(self) -> None:
        """One sample at once, beside the thread's: a lifetime's last, taken before its server is
        stopped, so that what the server held at the end (its peak, on a published reader) is in
        the series however short the lifetime was."""
        if not self._thread.is_alive():
            return
        with self._lock:
            self._take()

    def _take(self) -> bool:
        """Take, keep and write one sample; False once the reader has failed."""
        try:
            sample = self.sample()
        except Exception as exc:  # a reader failing mid-run ends the series
            self.died = f"sampling stopped: {type(exc).__name__}: {exc}"
            return False
        self.samples.append(sample)
        if self.guard is not None:
            self.guard.observe(sample)
        if self._out is not None:
            self._out = self._append(self._out, sample)
        return True

    def _run(self) -> None:
        """The thread: any way it ends before stop() is a death, recorded for the run to fail on
        (a series cut short must not pass for the server's whole timeline)."""
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - whatever killed it is what the run says
            self.died = f"the sampler died: {type(exc).__name__}: {exc}"

    def _loop(self) -> None:
        interval = 1.0 / self.hz
        self._out = self._open()
        try:
            due = time.monotonic()
            while not self._stop.is_set():
                with self._lock:
                    if not self._take():
                        return
                due += interval
                delay = due - time.monotonic()
                if delay < 0:  # fell behind: keep the rate, skip the missed slots
                    due, delay = time.monotonic(), 0
                self._stop.wait(delay)
        finally:
            with self._lock:
                if self._out is not None:
                    with contextlib.suppress(OSError):  # the line that failed is lost either way
                        self._out.close()
                    self._out = None

    def _open(self) -> TextIO | None:
        try:
            return open(self.path, "a", buffering=1, encoding="utf-8")
        except OSError as exc:
            self._unwritable(exc)
            return None

    def _append(self, out: TextIO, sample: Sample) -> TextIO | None:
        """Write one line; a file that cannot take it (a full disk) is closed and left as it
        is: the series goes on in memory, so the run's summary and peak stand."""
        try:
            out.write(json.dumps({"t": round(sample.t_s, 4), "device_mib": sample.device_mib,
                                  "process_mib": sample.process_mib}) + "\n")
            self._written += 1
            return out
        except OSError as exc:
            with contextlib.suppress(OSError):
                out.close()
            self._unwritable(exc)
            return None

    def _unwritable(self, exc: OSError) -> None:
        self.error = (f"the series file {self.path.name} holds the first {self._written} "
                      f"sample(s) only ({exc.strerror or exc}); the summary holds them all")


class GpuBusy(EnvironmentFailure):
    """The GPU did not go idle before a run."""


@dataclass(frozen=True)
class IdleReading:
    first_idle: int  # bytes: the run's first idle reading
    used: int  # bytes in use now, idle: another program's VRAM moved by used - first_idle


def idle_reading(reader: GpuReader, first_idle: int | None, *, timeout_s: float = 60,
                 tolerance_mib: float = 256, poll_s: float = 0.5,
                 ignore: Iterable[int] = ()) -> IdleReading:
    """Wait until no process computes on the GPU and its used memory is within `tolerance_mib`
    (hosts.toml idle_tolerance_mib) of the first idle reading (this one when none is given).
    Raises GpuBusy naming what holds the GPU when it does not go idle in time.
    """
    ignore = set(ignore) | {os.getpid()}
    deadline = time.monotonic() + timeout_s
    while True:
        used, _ = reader.memory()
        compute, _graphics = reader.processes()
        holders = {pid: mem for pid, mem in unique_processes(compute).items() if pid not in ignore}
        limit = None if first_idle is None else first_idle + tolerance_mib * MIB
        if not holders and (limit is None or used <= limit):
            return IdleReading(used if first_idle is None else first_idle, used)
        if time.monotonic() >= deadline:
            raise GpuBusy(_busy_message(reader, holders, used, first_idle, timeout_s,
                                        tolerance_mib))
        pause(poll_s)


def _busy_message(reader: GpuReader, holders: dict[int, int | None], used: int,
                  first_idle: int | None, timeout_s: float, tolerance_mib: float) -> str:
    parts = [f"pid {pid} ({reader.process_name(pid)}) holds "
             + (f"{mem / MIB:,.0f} MiB" if mem is not None else "an unknown amount")
             for pid, mem in sorted(holders.items())]
    if not parts:
        parts = [f"{used / MIB:,.0f} MiB in use against the first idle reading of "
                 f"{first_idle / MIB:,.0f} MiB, more than its tolerance of "
                 f"{tolerance_mib:,.0f} MiB (hosts.toml idle_tolerance_mib), held by no listed "
                 "process (another container?)"]
    return f"the GPU is not idle after {timeout_s:g} s: " + "; ".join(parts)
