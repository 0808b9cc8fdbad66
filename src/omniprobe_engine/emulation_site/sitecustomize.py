"""Caps PyTorch's CUDA memory in every process of an emulated host's server (issue 13).

omniprobe.harness.common.emulation puts this folder first on the server's PYTHONPATH and the cap in
OMNIPROBE_EMULATED_CAP_MIB, so every Python process the server starts, its workers included,
imports this file at startup. It stays inert until the process imports torch, then queues a call
with torch.cuda's lazy initialisation: at the process's first CUDA use, it creates the CUDA
context, measures it through NVML, and sets the per-process memory fraction to the cap less that
context. An allocation past it raises PyTorch's own CUDA out-of-memory error, "... allowed"
figure included, as on the smaller card, where the context also comes out of the card's memory.
torch.cuda.mem_get_info then answers as the smaller card would, so a server that sizes itself
from free memory (vLLM's profiling) sizes itself for the cap.

Why this mechanism: the fraction is enforced by PyTorch's caching allocator in each process, needs
no privileges and works in containers, and its failure is the OOM the probe already parses. It
does not cover memory allocated outside PyTorch (NCCL buffers, other libraries' own cudaMalloc,
context growth after the first use); the harness's sampler compares the whole process tree's
NVML memory against the cap for that, and a run over it is recorded as "emulation breached". An
MPS per-client memory limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) would cover those too, but needs
the host-wide MPS control daemon, run by root outside the container, which an emulating user
cannot assume. Single-GPU servers only: the cap is set on the device current at first use.

This file imports nothing from omniprobe: the server runs in its own environment, which may not
have omniprobe installed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

CAP_ENV = "OMNIPROBE_EMULATED_CAP_MIB"
LOG_PREFIX = "omniprobe-emulation:"
MIB = 1024**2


class EmulationError(RuntimeError):
    """The cap cannot be set honestly in this process."""


def allocator_fraction(cap_bytes: int, context_bytes: int, total_bytes: int) -> float:
    """The per-process memory fraction that lets PyTorch's allocator reserve the cap less this
    process's CUDA context, on a device of total_bytes."""
    if cap_bytes <= 0 or total_bytes <= 0 or context_bytes < 0:
        raise EmulationError(f"cap {cap_bytes}, context {context_bytes} and total {total_bytes} "
                             "bytes: expected a positive cap and total and a context >= 0")
    if cap_bytes > total_bytes:
        raise EmulationError(f"the cap of {cap_bytes / MIB:,.0f} MiB exceeds the device's "
                             f"{total_bytes / MIB:,.0f} MiB: nothing to emulate")
    allowed = cap_bytes - context_bytes
    if allowed <= 0:
        raise EmulationError(f"this process's CUDA context ({context_bytes / MIB:,.0f} MiB) "
                             f"already fills the cap of {cap_bytes / MIB:,.0f} MiB")
    return allowed / total_bytes


def capped_mem_info(free: int, total: int, cap: int, context: int, reserved: int) -> tuple[int, int]:
    """cudaMemGetInfo as the emulated card would answer it: its capacity as the total, and as
    free what this process may still reserve (never more than the physical GPU has free)."""
    return max(0, min(free, cap - context - reserved)), min(total, cap)


def cap_from_env(environ=os.environ) -> int | None:
    """The cap in bytes, or None when this process is not emulating."""
    text = environ.get(CAP_ENV)
    if text is None:
        return None
    if not text.isdigit() or int(text) == 0:
        raise EmulationError(f"{CAP_ENV} must be a positive whole number of MiB, got {text!r}")
    return int(text) * MIB


def process_bytes(pid: int, nvml) -> int:
    """Device memory NVML lists for one process, over every device (the context lives on one)."""
    nvml.nvmlInit()
    found = None
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        listed = (nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                  + nvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
        # A process may be listed as both compute and graphics: count it once per device.
        used = next((p.usedGpuMemory for p in listed if p.pid == pid), None)
        if used is not None:
            found = (found or 0) + used
    if found is None:
        raise EmulationError(f"NVML does not list process {pid} (another PID namespace?), so "
                             "its CUDA context cannot be measured and the cap cannot be set")
    return found


def cap_this_process() -> None:
    """At the first CUDA use: make the context, measure it, set the fraction, say so."""
    import pynvml
    import torch

    cap = cap_from_env()
    device = torch.cuda.current_device()
    torch.zeros(1, device=device)  # the context and a first kernel, as any first use makes them
    torch.cuda.synchronize(device)
    context = process_bytes(os.getpid(), pynvml) - torch.cuda.memory_reserved(device)
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = allocator_fraction(cap, max(context, 0), total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    _report_capped_memory(torch, cap, max(context, 0))
    print(f"{LOG_PREFIX} pid {os.getpid()} device {device} cap_mib {cap / MIB:.1f} "
          f"context_mib {max(context, 0) / MIB:.1f} allowed_mib {fraction * total / MIB:.1f} "
          f"fraction {fraction:.6f} total_mib {total / MIB:.1f}", file=sys.stderr, flush=True)


def _report_capped_memory(torch, cap: int, context: int) -> None:
    """Servers size themselves from torch.cuda.mem_get_info (vLLM's memory profiling does): make
    it describe the emulated card, not the physical GPU. get_device_properties().total_memory
    still tells the physical size; the guard stands behind both."""
    physical = torch.cuda.mem_get_info

    def mem_get_info(device=None):
        free, total = physical(device)
        return capped_mem_info(free, total, cap, context, torch.cuda.memory_reserved(device))

    torch.cuda.mem_get_info = torch.cuda.memory.mem_get_info = mem_get_info


def arm(torch_module) -> None:
    """Queue the cap with torch.cuda's lazy initialisation (it runs at once if CUDA is up)."""
    lazy_call = getattr(torch_module.cuda, "_lazy_call", None)
    if lazy_call is None:
        raise EmulationError(f"torch {torch_module.__version__} has no torch.cuda._lazy_call: "
                             "the emulation cap cannot be queued for the first CUDA use")
    lazy_call(cap_this_process)


class _TorchWatcher:
    """Arms the cap right after torch is imported, without importing torch itself. A meta path
    finder needs only `find_spec`: importlib.abc's base class would import importlib.resources
    and tempfile, some 10 ms of every start of every server this file is loaded in."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_arm(module):
            exec_module(module)
            arm(module)

        spec.loader.exec_module = exec_and_arm
        return spec


def _chain_next_sitecustomize() -> None:
    """Run the sitecustomize this file shadows, if the environment has one."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def install() -> None:
    try:
        cap = cap_from_env()
    except EmulationError as exc:
        # site.py would print an exception and run the server uncapped: stop it instead.
        print(f"{LOG_PREFIX} error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    if cap is not None:
        if "torch" in sys.modules:
            arm(sys.modules["torch"])
        else:
            sys.meta_path.insert(0, _TorchWatcher())
    _chain_next_sitecustomize()


if __name__ == "sitecustomize":
    install()
