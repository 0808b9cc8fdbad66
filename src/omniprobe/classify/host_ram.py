"""Whether a process that died ran out of host RAM or of GPU memory, from the signs it left.

A server or runner the kernel killed for memory is a host-RAM failure: a fact of the card's host
(CPU offload keeps the weights in host RAM, and a 30 GiB host runs out), never a lost request to
send again. The signs, strongest first; the first that shows decides:

1. the kernel's OOM killer counted a kill: `oom_kill` of a cgroup's `memory.events` rose while
   the process ran (cgroup v2 counts a kill of any kind of OOM killer in the cgroups above it);
2. the process was SIGKILLed (-9 from Popen, 137 from a keeper that exits 128 + N) while the
   host's available memory stood low in the sampler's last readings;
3. PyTorch's CUDA out-of-memory text: a GPU OOM;
4. a CUDA "out of memory" raised outside PyTorch's allocator (`CUDA error: out of memory`, as
   pinning host memory for CPU offload raises it) is the host's while the GPU had room, and the
   GPU's while it had none.

Anything else is neither (None): a SIGKILL with plenty of host memory came from someone else.
The two thresholds are chosen by omniprobe, not taken from any source.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from omniprobe.classify.oom import is_oom

# Chosen by omniprobe: below this much available host memory in the sampler's last readings, a
# SIGKILL is the kernel's (sampled at 10 Hz, a model loading at a few GB/s leaves a few hundred
# MiB at the last reading before the killer acts).
LOW_AVAILABLE_MIB = 1024.0
# Chosen by omniprobe: with this much of the GPU free, a CUDA "out of memory" that PyTorch's
# allocator did not raise was not the GPU's.
GPU_ROOM_MIB = 1024.0
_DRIVER_OOM = re.compile(r"CUDA error: out of memory")
_SIGKILL = (-signal.SIGKILL, 128 + signal.SIGKILL)


@dataclass(frozen=True)
class MemoryFailure:
    kind: Literal["host-ram", "gpu-oom"]
    sign: str  # what showed it, in words, for the failure's recorded reason


def memory_failure(oom_kills: tuple[int, int] | None, returncode: int | None,
                   available_mib: Sequence[float] | None, text: str,
                   gpu_free_mib: float | None) -> MemoryFailure | None:
    """Which memory a failed process ran out of, if its signs say.

    - `oom_kills`: a cgroup's `memory.events` `oom_kill` count (before, after) the process ran;
      None where there is no such cgroup.
    - `returncode`: the process's exit status (negative: the signal that killed it); None while
      it runs.
    - `available_mib`: the host's available memory (MemAvailable) in the sampler's last readings,
      oldest first; None where none were taken.
    - `text`: the process's error text or log.
    - `gpu_free_mib`: the GPU's free memory at the sampler's last reading; None where unknown.
    """
    if oom_kills is not None and oom_kills[1] > oom_kills[0]:
        return MemoryFailure("host-ram", f"the kernel's OOM killer: the cgroup's memory.events "
                                         f"oom_kill went from {oom_kills[0]} to {oom_kills[1]}")
    if returncode in _SIGKILL and available_mib and min(available_mib) < LOW_AVAILABLE_MIB:
        return MemoryFailure("host-ram", f"killed by SIGKILL (exit {returncode}) with the host's "
                                         f"available memory at {min(available_mib):,.0f} MiB in "
                                         "the sampler's last readings")
    if is_oom(text):
        return MemoryFailure("gpu-oom", "CUDA out of memory")
    if _DRIVER_OOM.search(text) and gpu_free_mib is not None:
        if gpu_free_mib >= GPU_ROOM_MIB:
            return MemoryFailure("host-ram", "CUDA error: out of memory outside PyTorch's "
                                             f"allocator with {gpu_free_mib:,.0f} MiB of the GPU "
                                             "free (pinned host memory ran out)")
        return MemoryFailure("gpu-oom", f"CUDA error: out of memory with {gpu_free_mib:,.0f} MiB "
                                        "of the GPU free")
    return None


# --- whether a run's footprint fits its card's host --------------------------------------------


@dataclass(frozen=True)
class HostRamFit:
    """Which side of the host's RAM a run's host footprint fell, and by how much.

    zram is not emulated, and random weights do not compress as real ones do, so swap or zram
    is never counted for or against a fit: the footprint is held against the RAM alone. Pinned
    (page-locked) memory can never leave RAM; only the pageable rest could ever go to swap."""

    fits: bool | None  # None: nothing says (no figure, no cap no larger than the RAM)
    host_ram_mib: int
    footprint_mib: float | None  # the most the run held (peak RSS, a cgroup's peak)
    pinned_mib: float | None
    killed: bool = False

    @property
    def margin_mib(self) -> float | None:
        """RAM left over at the footprint's peak (negative: over by that much)."""
        return None if self.footprint_mib is None else self.host_ram_mib - self.footprint_mib

    @property
    def pinned_over(self) -> bool:
        """The page-locked part alone is more than the RAM: no swap of any kind could help."""
        return self.pinned_mib is not None and self.pinned_mib > self.host_ram_mib

    def text(self) -> str:
        gib = lambda mib: f"{mib / 1024:.1f}"  # noqa: E731
        ram = f"the host's {gib(self.host_ram_mib)} GiB of RAM"
        if self.killed:
            return f"over {ram}: the kernel killed the runner at the cap"
        if self.margin_mib is None:
            return (f"within {ram} (held under a cap no larger)" if self.fits
                    else f"not known against {ram}")
        pinned = (f", {gib(self.pinned_mib)} GiB of it pinned" if self.pinned_mib else "")
        if self.margin_mib >= 0:
            return f"within {ram} by {gib(self.margin_mib)} GiB{pinned}"
        if self.pinned_over:
            return (f"over {ram} by {gib(-self.margin_mib)} GiB{pinned}: page-locked memory "
                    "alone exceeds the RAM, which no swap can take")
        return (f"over {ram} by {gib(-self.margin_mib)} GiB{pinned}; only its pageable part "
                "could go to swap or zram, which is neither emulated nor counted")


def host_ram_fit(host_ram_mib: int, *, footprint_mib: float | None, pinned_mib: float | None,
                 cap_mib: int | None, killed: bool) -> HostRamFit:
    """The rule: a run the kernel killed at its cap does not fit; one whose pinned memory alone
    exceeds the RAM does not; otherwise its footprint is held against the RAM (swap and zram
    count neither way); with no footprint, a run under a cap no larger than the RAM fits, for it
    held no more than the cap."""
    if killed:
        fits: bool | None = False
    elif pinned_mib is not None and pinned_mib > host_ram_mib:
        fits = False
    elif footprint_mib is not None:
        fits = footprint_mib <= host_ram_mib
    elif cap_mib is not None and cap_mib <= host_ram_mib:
        fits = True
    else:
        fits = None
    return HostRamFit(fits, host_ram_mib, footprint_mib, pinned_mib, killed)
