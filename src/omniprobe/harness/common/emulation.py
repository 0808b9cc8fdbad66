"""Capacity emulation: a smaller card's memory imposed on a bigger GPU, and the guard that checks it.

The cap reaches the server through its environment (`emulation_env`): under the memory-fraction
mechanism, the startup hook in `omniprobe_engine/emulation_site/` caps PyTorch in every server process; under
sim-account, the simulated server's accounted memory takes the cap as its total. The hook cannot
see memory allocated outside PyTorch, so `EmulationGuard` compares the whole process tree's NVML
memory against the cap at every sample, and the first sample over it is the breach a run records.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from omniprobe.classify.series import Sample
from omniprobe.config.host_entry import Host
from omniprobe.errors import EnvironmentFailure
from omniprobe.evidence.models.common import EmulationBreach
from omniprobe.evidence.models.runs import CappedProcess, EmulationCheck
from omniprobe.limits import MAX_MIB
from omniprobe_engine import emulation_site
from omniprobe_engine.emulation_site.sitecustomize import CAP_ENV, LOG_PREFIX

HOOK_DIR = Path(emulation_site.__file__).parent


class EmulationUnguarded(EnvironmentFailure):
    """An emulated host's server cannot be sampled, so its cap could not be checked."""


def emulation_env(host: Host, cap_mib: int, base: dict[str, str]) -> dict[str, str]:
    """What the server's environment adds to impose the cap."""
    env = {CAP_ENV: str(cap_mib)}
    if host.emulation is not None and host.emulation.mechanism == "memory-fraction":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HOOK_DIR), base.get("PYTHONPATH")]))
    return env


def parse_caps_gib(text: str) -> list[int]:
    """`--caps 12,16,20.5` (GiB) as MiB, ascending and each once; ValueError naming the bad item."""
    caps = set()
    for item in text.split(","):
        try:
            gib = float(item)
        except ValueError:
            raise ValueError(f"expects GiB figures separated by commas, got {item!r}") from None
        mib = round(gib * 1024) if math.isfinite(gib) else 0
        if not 1 <= mib <= MAX_MIB:
            raise ValueError(f"each cap is a number of GiB from 1 MiB (0.001) up to "
                             f"{MAX_MIB // 1024} GiB (2**40 bytes), got {item!r}")
        caps.add(mib)
    return sorted(caps)


_CAPPED = re.compile(re.escape(LOG_PREFIX) + r" pid (\d+) device \d+ cap_mib [\d.]+ "
                     r"context_mib ([\d.]+) allowed_mib ([\d.]+)")


def capped_processes(log_text: str) -> list[CappedProcess]:
    """The processes the hook capped, from the lines it writes to the server log."""
    return [CappedProcess(pid=int(m[1]), context_mib=float(m[2]), allowed_mib=float(m[3]))
            for m in _CAPPED.finditer(log_text)]


class EmulationGuard:
    """Fed every sample of one server lifetime: the tree's memory against the cap.

    The tree's figure is NVML's per-process memory of the server and its descendants; where NVML
    lists none of them (another PID namespace), the device's use over its first idle reading stands in,
    which can only overstate the tree. A sample with neither is counted as unchecked.
    """

    def __init__(self, cap_mib: int, idle_mib: float | None = None):
        self.cap_mib, self.idle_mib = cap_mib, idle_mib
        self.checked = self.unchecked = 0
        self.peak_mib: float | None = None
        self.breach: EmulationBreach | None = None

    def held_mib(self, sample: Sample) -> float | None:
        if sample.process_mib is not None:
            return sample.process_mib
        if self.idle_mib is not None:
            return max(0.0, sample.device_mib - self.idle_mib)
        return None

    def observe(self, sample: Sample) -> None:
        held = self.held_mib(sample)
        if held is None:
            self.unchecked += 1
            return
        self.checked += 1
        self.peak_mib = held if self.peak_mib is None else max(self.peak_mib, held)
        if self.breach is None and held > self.cap_mib:
            self.breach = EmulationBreach(t_s=round(max(sample.t_s, 0.0), 3),
                                          held_mib=round(held, 1), cap_mib=self.cap_mib)

    def breach_by(self, t_s: float) -> EmulationBreach | None:
        """The breach, if it happened at or before t_s (seconds since the server started)."""
        return self.breach if self.breach is not None and self.breach.t_s <= t_s else None

    def check(self, capped: list[CappedProcess] = ()) -> EmulationCheck:
        return EmulationCheck(cap_mib=self.cap_mib, checked_samples=self.checked,
                              unchecked_samples=self.unchecked,
                              peak_mib=None if self.peak_mib is None else round(self.peak_mib, 1),
                              breach=self.breach, capped=list(capped))
