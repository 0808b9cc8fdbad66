"""Where the simulated server's memory goes: an account kept by the capacity model, or real CUDA.

Both backends hand out opaque blocks and raise an out-of-memory error carrying PyTorch's text,
so the model code above them does not know which one it runs on.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

MIB = 1024**2
# pid, used bytes, total bytes, peak bytes (the most used since the server started): the file the
# harness's sampler reads where a real host has NVML (the harness names the file in the variable of
# hosts.toml memory_file_env). Keep in step with harness/common/sampler.py PUBLISHED_MEMORY.
_STATE = struct.Struct("<qqqq")


class OutOfMemoryError(RuntimeError):
    """The accounted backend's torch.OutOfMemoryError; its text is PyTorch's own format."""


def format_size(size: int) -> str:
    """A byte count as c10's CUDACachingAllocator formats it (note the <= bounds)."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1024**2:
        return f"{size / 1024:.2f} KiB"
    if size <= 1024**3:
        return f"{size / 1024**2:.2f} MiB"
    return f"{size / 1024**3:.2f} GiB"


def oom_message(*, requested: int, total: int, free: int, in_use: int, allocated: int,
                reserved: int, allowed: int | None = None, device: int = 0) -> str:
    """PyTorch's CUDA OOM message (c10/cuda/CUDACachingAllocator.cpp, 2.1+)."""
    allowed_info = f"{format_size(allowed)} allowed; " if allowed is not None else ""
    return (
        f"CUDA out of memory. Tried to allocate {format_size(requested)}. GPU {device} has a "
        f"total capacity of {format_size(total)} of which {format_size(free)} is free. "
        f"Including non-PyTorch memory, this process has {format_size(in_use)} memory in use. "
        f"{allowed_info}Of the allocated memory {format_size(allocated)} is allocated by "
        f"PyTorch, and {format_size(reserved - allocated)} is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


@dataclass
class Account:
    """What the sim held: its peak reserved memory plus the CUDA context, in MiB."""

    backend: str
    max_reserved_mib: float
    context_mib: float

    @property
    def held_mib(self) -> float:
        return self.max_reserved_mib + self.context_mib

    def as_dict(self) -> dict:
        return {"backend": self.backend, "max_reserved_mib": round(self.max_reserved_mib, 1),
                "context_mib": round(self.context_mib, 1), "held_mib": round(self.held_mib, 1)}


class StateFile:
    """The accounted memory, published for the harness's sampler in place of NVML."""

    def __init__(self, path: str, total: int):
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._total = total

    def publish(self, used: int, peak: int) -> None:
        os.pwrite(self._fd, _STATE.pack(os.getpid(), used, self._total, peak), 0)


class Accounted:
    """No GPU: the capacity model's account is the memory; the card is full at vram_mib."""

    oom_error = OutOfMemoryError

    def __init__(self, total: int, context: int, state: StateFile | None = None):
        self.total, self.context, self._state = total, context, state
        self.allocated = 0
        self._lifetime_peak = 0
        self._request_peak = 0
        self._publish()

    def _publish(self) -> None:
        if self._state is not None:
            self._state.publish(self.context + self.allocated, self.context + self._lifetime_peak)

    def alloc(self, nbytes: int) -> int:
        in_use = self.context + self.allocated
        if in_use + nbytes > self.total:
            raise OutOfMemoryError(oom_message(
                requested=nbytes, total=self.total, free=self.total - in_use, in_use=in_use,
                allocated=self.allocated, reserved=self.allocated))
        self.allocated += nbytes
        self._lifetime_peak = max(self._lifetime_peak, self.allocated)
        self._request_peak = max(self._request_peak, self.allocated)
        self._publish()
        return nbytes

    def release(self, blocks: list) -> None:
        self.allocated -= sum(blocks)
        blocks.clear()
        self._publish()

    def start_request(self) -> None:
        self._request_peak = self.allocated

    def request_peak_mib(self) -> float:
        return self._request_peak / MIB

    def account(self) -> Account:
        return Account("accounted", self._lifetime_peak / MIB, self.context / MIB)


class Torch:
    """Real CUDA allocations through torch; with a cap (bytes), capped with the per-process
    memory fraction, else by whatever caps the process (the card itself, or an emulation hook)."""

    def __init__(self, cap: int | None):
        import torch

        self.torch = torch
        self.oom_error = torch.cuda.OutOfMemoryError
        before = _device_used()
        torch.zeros(1, device="cuda")  # creates the context and loads a kernel, as a model would
        after = _device_used()
        total = torch.cuda.get_device_properties(0).total_memory
        if cap is not None:
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total))
        reserved = torch.cuda.memory_reserved()
        self.context = max(0, after - before - reserved) if None not in (before, after) else 0
        self._lifetime_reserved = 0

    def alloc(self, nbytes: int):
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda")

    def release(self, blocks: list) -> None:
        blocks.clear()

    def start_request(self) -> None:
        self._lifetime_reserved = max(self._lifetime_reserved,
                                      self.torch.cuda.max_memory_reserved())
        self.torch.cuda.reset_peak_memory_stats()

    def request_peak_mib(self) -> float:
        return self.torch.cuda.max_memory_allocated() / MIB

    def account(self) -> Account:
        reserved = max(self._lifetime_reserved, self.torch.cuda.max_memory_reserved())
        return Account("torch", reserved / MIB, self.context / MIB)


def _device_used() -> int | None:
    """Device memory in use through NVML (for the CUDA context's size); None without NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index())
        return pynvml.nvmlDeviceGetMemoryInfo(handle).used
    except pynvml.NVMLError:
        return None


def _nvml_index() -> int:
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0
