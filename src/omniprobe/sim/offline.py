"""`python -m omniprobe.sim offline --hosts-file F --sim-host H <runner arguments>`: the offline
runner's protocol (omniprobe.offline_runner) over the capacity model instead of vLLM-Omni.

The kwargs map onto the same flags the simulated server takes, so offline and serve runs of one
configuration allocate alike and render the same pictures. Everything it writes is simulated.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

from omniprobe.atomic import write_bytes_atomic
from omniprobe.config.hosts import SimCapacity
from omniprobe.harness import offline_runner
from omniprobe.sim.http import Faults
from omniprobe.sim.knobs import flags_from_kwargs
from omniprobe.sim.model import Pipeline, Request


class SimEngine:
    def __init__(self, cap: SimCapacity, kwargs: dict, memory, time_scale: float, faults: Faults):
        self.memory, self.faults, self.count = memory, faults, 0
        self.pipeline = Pipeline(cap, flags_from_kwargs(kwargs), memory, time_scale)
        try:
            self.pipeline.init_parameters()
        except Exception:
            # As upstream's executor workers do: the worker's traceback (the CUDA OOM text) goes
            # to its log, here the runner's stderr; the caller sees only the orchestrator's word.
            traceback.print_exc(file=sys.stderr)
            raise RuntimeError("Orchestrator initialization failed: stage 0 worker exited "
                               "during init; see the worker log") from None

    def generate(self, request: dict) -> float:
        self.count += 1
        if self.count in self.faults.crash:
            raise SystemExit("RuntimeError: CUDA error: an illegal memory access was encountered")
        if self.count in self.faults.hang:
            time.sleep(3600)
        if self.count in self.faults.malformed:
            write_bytes_atomic(request["output"], b"\x89PNG not really")
            return 0.0
        references = [Path(p).read_bytes() for p in request["references"]]
        output = self.pipeline.generate(Request(
            prompt=request["prompt"], references=references, width=request["width"],
            height=request["height"], seed=request["seed"], steps=request["num_inference_steps"]))
        write_bytes_atomic(request["output"], output.png)
        return round(output.peak_memory_mb, 1)

    def recover(self) -> None:
        """Nothing to tidy: the pipeline releases a failed request's blocks itself."""


def main(argv: list[str], cap: SimCapacity, memory, time_scale: float, faults: Faults) -> int:
    return offline_runner.main(
        argv, engine=lambda model, kwargs: SimEngine(cap, kwargs, memory, time_scale, faults),
        prog="python -m omniprobe.sim offline")
