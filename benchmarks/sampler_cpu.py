"""CPU cost of the GPU memory sampler at 10 Hz and 100 Hz. Target: under 1% of a core at 10 Hz.

Uses NVML when this machine has it; otherwise the scripted fake NVML (`omniprobe.fakenvml`),
which the output says, since then only the sampler's own work is measured, not NVML's.
The server's process tree is this process and one child, as under a real probe.

    PYTHONPATH=src python3 benchmarks/sampler_cpu.py [SECONDS]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fakenvml import FakeNvml, Frame

from omniprobe.harness.common.sampler import MIB, NvmlReader, NvmlUnavailable, Sampler


def reader_and_label(child: int) -> tuple[NvmlReader, str]:
    try:
        return NvmlReader(0), "NVML (GPU 0)"
    except NvmlUnavailable as exc:
        fake = FakeNvml([Frame(0.0, 20_000 * MIB,
                               compute=((child, 18_000 * MIB), (4_000_000, 1_000 * MIB)),
                               graphics=((child, 18_000 * MIB),))])
        return NvmlReader(nvml=fake), f"fake NVML (no NVML here: {exc})"


def measure(reader: NvmlReader, hz: float, seconds: float, root: int, folder: Path) -> tuple:
    sampler = Sampler(reader, folder / f"series-{hz:g}.jsonl", hz=hz, root_pid=lambda: root)
    idle_cpu = time.process_time()
    time.sleep(seconds / 4)  # what this process spends doing nothing, to subtract
    idle_rate = (time.process_time() - idle_cpu) / (seconds / 4)
    cpu, wall = time.process_time(), time.monotonic()
    sampler.start()
    time.sleep(seconds)
    summary = sampler.stop()
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    return 100 * (cpu / wall - idle_rate), summary


def main(seconds: float) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        reader, label = reader_and_label(child.pid)
        print(f"sampler CPU cost, {seconds:g} s per rate, reader: {label}")
        with tempfile.TemporaryDirectory() as folder:
            for hz in (10.0, 100.0):
                percent, summary = measure(reader, hz, seconds, os.getpid(), Path(folder))
                target = "  (target < 1%)" if hz == 10 else ""
                print(f"  {hz:5.0f} Hz: {percent:5.2f}% of a core, {summary.samples} samples at "
                      f"{summary.rate_hz} Hz achieved, server peak {summary.peak_mib} MiB "
                      f"({summary.peak_source}){target}")
    finally:
        child.kill()
        child.wait()


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 10.0)
