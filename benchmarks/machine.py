"""The machine a benchmark ran on, for its output: a figure means little without it."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import numpy as np


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> str:
    """CPU model, cores, Python, numpy, the load when it started, and any OpenBLAS override
    (OPENBLAS_CORETYPE picks an older, slower kernel on some processors)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    blas = [f"{name}={os.environ[name]}" for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
            if name in os.environ]
    return (f"machine: {cpu_model()}, {usable} usable of {os.cpu_count()} cores; "
            f"Python {platform.python_version()}, numpy {np.__version__}; load average {load}"
            + (f"; {' '.join(blas)}" if blas else ""))
