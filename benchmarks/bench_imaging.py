"""Benchmark: image metrics for both images plus PSNR of a 1248x832 RGBA pair (target < 30 ms).

    python3 benchmarks/bench_imaging.py [--repeat N]

The timed step is what the structure check does per output once images are decoded: metrics of
the output and of its baseline, then PSNR. Decoding the two PNGs is timed separately.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from machine import describe
from PIL import Image

from omniprobe.classify.imaging import load_pixels, measure, psnr, to_pixels
from omniprobe.config.report_settings import StructureChecks

WIDTH, HEIGHT = 1248, 832
TARGET_MS = 30.0


def pair(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A smooth opaque RGBA image with texture, and a noisy copy of it."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    base = np.empty((HEIGHT, WIDTH, 4), np.uint8)
    base[..., 0] = (127 + 100 * np.sin(x / 50)).astype(np.uint8)
    base[..., 1] = (127 + 100 * np.cos(y / 40)).astype(np.uint8)
    base[..., 2] = (255 * x / WIDTH).astype(np.uint8)
    base[..., 3] = 255
    noisy = base.copy()
    noisy[..., :3] = np.clip(base[..., :3] + rng.normal(0, 6, (HEIGHT, WIDTH, 3)), 0, 255)
    return base, noisy


def timings_ms(step: Callable[[], object], repeat: int) -> tuple[list[float], list[float]]:
    """Wall and CPU time of each run; on a shared machine the CPU time is the steadier figure."""
    step()  # warm-up: first-call allocations are not the steady state
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        step()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    machine = describe()  # before the run: the load average is the machine's, not ours
    cfg = StructureChecks()
    base, noisy = pair()
    a, b = to_pixels(Image.fromarray(base), "baseline"), to_pixels(Image.fromarray(noisy), "output")

    def metrics_and_psnr() -> None:
        measure(a, cfg)
        measure(b, cfg)
        psnr(a, b)

    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / "a.png", Path(tmp) / "b.png"]
        for path, array in zip(paths, (base, noisy), strict=True):
            Image.fromarray(array).save(path)
        decode, _ = timings_ms(lambda: [load_pixels(p) for p in paths], max(args.repeat // 5, 3))

    steady, cpu = timings_ms(metrics_and_psnr, args.repeat)
    median = statistics.median(steady)
    print(f"metrics x2 + PSNR, {WIDTH}x{HEIGHT} RGBA pair, {args.repeat} runs: "
          f"median {median:.1f} ms, min {min(steady):.1f} ms, max {max(steady):.1f} ms "
          f"(target < {TARGET_MS:.0f} ms: {'met' if median < TARGET_MS else 'MISSED'}); "
          f"CPU time median {statistics.median(cpu):.1f} ms")
    print(f"decoding the two PNGs (not in the figure above): median "
          f"{statistics.median(decode):.1f} ms")
    print(machine)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
