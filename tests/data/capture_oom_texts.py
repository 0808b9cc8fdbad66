"""Capture PyTorch's own CUDA OOM messages on a real GPU, for the OOM parser's table tests.

Each case runs in a fresh process (allocator settings only apply before CUDA starts) and prints
one JSON object; the whole run prints a JSON list. Run on a CUDA machine:

    python3 tests/data/capture_oom_texts.py > tests/data/oom_real.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CASES = {
    # name: (environment, per-process cap as a fraction of the card or None, allocations in MiB)
    "capped_24gib": ({}, 24, [20 * 1024, 6 * 1024]),
    "capped_24gib_expandable": ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, 24,
                                [20 * 1024, 6 * 1024]),
    "uncapped_too_large": ({}, None, [4 * 1024 * 1024]),
    "capped_small_ask": ({}, 1, [1000, 490]),
}


def run_case(name: str) -> None:
    import torch

    _, cap_gib, asks = CASES[name]
    total = torch.cuda.get_device_properties(0).total_memory
    if cap_gib is not None:
        torch.cuda.set_per_process_memory_fraction(cap_gib * 1024**3 / total)
    held = []
    try:
        for mib in asks:
            held.append(torch.empty(mib * 1024**2, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as exc:
        print(json.dumps({"case": name, "torch": torch.__version__,
                          "exception": f"{type(exc).__module__}.{type(exc).__qualname__}",
                          "message": str(exc)}))
        return
    raise SystemExit(f"{name}: no OOM")


def main() -> None:
    if len(sys.argv) == 2:
        run_case(sys.argv[1])
        return
    out = []
    for name, (env, _, _) in CASES.items():
        done = subprocess.run([sys.executable, __file__, name], env={**os.environ, **env},
                              capture_output=True, text=True, timeout=300, check=True)
        out.append(json.loads(done.stdout))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
