"""The GPU and its host: NVML's facts, and the checks of them (and of what the venv's torch sees)
against hosts.toml. The `nvml` argument stands in for pynvml, so tests fake the GPU at that layer
only."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path
from typing import Any

from omniprobe.config.cards import vram_off
from omniprobe.config.host_entry import Host
from omniprobe.env.check_record import env_check
from omniprobe.evidence.models.environment import EnvCheck, GpuFacts, HostFacts


def load_nvml() -> Any:
    import pynvml

    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read_gpu(nvml: Any, index: int = 0) -> GpuFacts:
    """Device `index` as NVML reports it; raises whatever NVML raises when it cannot."""
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        cuda = nvml.nvmlSystemGetCudaDriverVersion()
        return GpuFacts(
            index=index,
            device_count=nvml.nvmlDeviceGetCount(),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            memory_total_mib=nvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
            compute_capability=f"{major}.{minor}",
            driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
        )
    finally:
        nvml.nvmlShutdown()


def memory_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 2)
    except OSError:
        return None
    return None


def host_facts(nvml: Any) -> HostFacts:
    gpu, error = None, None
    try:
        gpu = read_gpu(load_nvml() if nvml is None else nvml)
    except Exception as exc:  # NVML raises its own error classes, or the library is missing
        error = f"{type(exc).__name__}: {exc}"
    return HostFacts(hostname=socket.gethostname(), platform=platform.platform(),
                     machine=platform.machine(), cpu_count=os.cpu_count(),
                     memory_total_gib=memory_total_gib(), gpu=gpu, nvml_error=error)


def gpu_checks(host: Host, facts: HostFacts, tolerance: float) -> list[EnvCheck]:
    """NVML against hosts.toml; an emulated host's entry describes its physical GPU."""
    if host.simulated and host.emulation is None:
        return [env_check("gpu.nvml", "skip", "simulated host: its GPU is modelled, not checked")]
    gpu = facts.gpu
    if gpu is None:
        return [env_check("gpu.nvml", "fail", f"NVML cannot read a GPU: {facts.nvml_error}",
                          expected=host.gpu)]
    gib = gpu.memory_total_mib / 1024
    found = env_check("gpu.nvml", "pass", f"{gpu.device_count} device(s); checked index {gpu.index}")
    driver = env_check("gpu.driver", "pass",
                       f"recorded; driver supports CUDA {gpu.cuda_driver_version}",
                       actual=gpu.driver_version)
    if host.gpu_minimum is not None:
        return [found, *_minimum_checks(host, gpu, gib), driver]
    off = vram_off(gpu.memory_total_mib, host.vram_gb)
    return [
        found,
        env_check("gpu.name", "pass" if gpu.name == host.gpu else "fail",
                  "NVML's device name against hosts.toml gpu", host.gpu, gpu.name),
        env_check("gpu.compute_capability",
                  "pass" if gpu.compute_capability == host.compute_capability else "fail",
                  "NVML's compute capability against hosts.toml", host.compute_capability,
                  gpu.compute_capability),
        env_check("gpu.memory", "pass" if off <= tolerance else "fail",
                  f"NVML total {gpu.memory_total_mib} MiB is {off:.1%} from the nominal "
                  f"{host.vram_gb} GB (tolerance {tolerance:.0%})",
                  f"{host.vram_gb} GiB", f"{gib:.2f} GiB"),
        driver,
    ]


def _minimum_checks(host: Host, gpu, gib: float) -> list[EnvCheck]:
    """A host that is any machine with a GPU of at least its minimums: those, not a name."""
    least = host.gpu_minimum
    return [
        env_check("gpu.name", "skip", f"any GPU of at least {least.memory_gib} GiB and "
                  f"compute capability {least.compute_capability} runs it", host.gpu, gpu.name),
        env_check("gpu.compute_capability",
                  "pass" if least.capable(gpu.compute_capability) else "fail",
                  "NVML's compute capability against hosts.toml's minimum",
                  f">= {least.compute_capability}", gpu.compute_capability),
        env_check("gpu.memory", "pass" if gib >= least.memory_gib else "fail",
                  f"NVML total {gpu.memory_total_mib} MiB against hosts.toml's minimum",
                  f">= {least.memory_gib} GiB", f"{gib:.2f} GiB"),
    ]


def emulation_check(cap_mib: int, facts: HostFacts) -> EnvCheck:
    """An emulated host's cap must fit the physical GPU; it is recorded either way."""
    gpu = facts.gpu
    if gpu is None:
        return env_check("emulation.cap", "fail", f"NVML cannot read the physical GPU: "
                         f"{facts.nvml_error}", expected=f"a GPU of more than {cap_mib} MiB")
    fits = cap_mib < gpu.memory_total_mib
    return env_check("emulation.cap", "pass" if fits else "fail",
                     f"the emulated {cap_mib:,} MiB against the physical {gpu.name}'s "
                     f"{gpu.memory_total_mib:,} MiB", f"< {gpu.memory_total_mib} MiB",
                     f"{cap_mib} MiB")


def torch_check(host: Host, probe: dict | None, torch_pinned: bool) -> EnvCheck:
    if not torch_pinned:
        return env_check("torch.cuda", "skip", "torch is not among this env's pins")
    if host.simulated:
        return env_check("torch.cuda", "skip", "simulated host: no GPU is expected")
    if probe is None:
        return env_check("torch.cuda", "fail", "no venv interpreter to import torch with")
    info = probe.get("torch") or {}
    if "error" in info:
        return env_check("torch.cuda", "fail", f"import torch failed: {info['error']}")
    if not info.get("available"):
        return env_check("torch.cuda", "fail",
                         f"torch {info.get('version')} (CUDA {info.get('cuda')}) sees no CUDA device",
                         host.gpu)
    seen = f"{info['name']} sm {info['capability']}"
    least = host.gpu_minimum
    if least is not None:  # any such GPU: its capability against the minimum
        good = least.capable(info["capability"])
        wanted = f"a GPU of sm {least.compute_capability} or later"
    else:
        good = info["name"] == host.gpu and info["capability"] == host.compute_capability
        wanted = f"{host.gpu} sm {host.compute_capability}"
    return env_check("torch.cuda", "pass" if good else "fail",
                     f"torch {info['version']} with CUDA {info['cuda']} sees device 0", wanted,
                     seen)
