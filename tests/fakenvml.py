"""A scripted stand-in for the pynvml module, for tests and benchmarks on machines without a GPU.

`FakeNvml(script)` answers the calls `gpu.NvmlReader` makes. The script maps the seconds since the
fake was created to what the device shows from then on, so a test can lay out a memory series.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    pass


@dataclass(frozen=True)
class Frame:
    """What the device shows from `at_s` on: used bytes and (pid, bytes) per list."""

    at_s: float
    used: int
    compute: tuple[tuple[int, int | None], ...] = ()
    graphics: tuple[tuple[int, int | None], ...] = ()


@dataclass
class FakeNvml:
    frames: list[Frame]
    total: int = 24 * 1024**3
    name: str = "Fake GPU"
    compute_capability: tuple[int, int] = (8, 6)
    names: dict[int, str] = field(default_factory=dict)
    fail_init: str | None = None
    device_count: int = 1
    NVMLError = NVMLError

    def __post_init__(self) -> None:
        self.start = time.monotonic()
        self.calls = 0

    def _frame(self) -> Frame:
        now = time.monotonic() - self.start
        current = self.frames[0]
        for frame in self.frames:
            if frame.at_s <= now:
                current = frame
        return current

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError(self.fail_init)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return self.device_count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle):
        self.calls += 1
        return SimpleNamespace(used=self._frame().used, total=self.total)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self._frame().compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self._frame().graphics]

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        if pid not in self.names:
            raise NVMLError("Not Found")
        return self.names[pid]

    def nvmlDeviceGetName(self, handle) -> str:
        return self.name

    def nvmlDeviceGetCudaComputeCapability(self, handle) -> tuple[int, int]:
        return self.compute_capability

    def nvmlSystemGetDriverVersion(self) -> str:
        return "fake"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080
