"""`python -m omniprobe.sim offline --hosts-file F --sim-host H <runner arguments>`: the offline
runner's protocol (omniprobe_engine.runner, called in this process) over the capacity model
instead of vLLM-Omni.

The kwargs map onto the same flags the simulated server takes, so offline and serve runs of one
configuration allocate alike and render the same pictures. Everything it writes is simulated.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

from omniprobe.atomic import write_bytes_atomic
from omniprobe.sim.capacity import Capacity
from omniprobe.sim.http import Faults
from omniprobe.sim.knobs import flags_from_kwargs
from omniprobe.sim.model import Pipeline, Request
from omniprobe_engine import runner as offline_runner


class EngineClosed(RuntimeError):
    """A request to an engine that a failed request shut down."""


class SimEngine:
    peak_source = "sim-model"

    def __init__(self, cap: Capacity, kwargs: dict, memory, time_scale: float, faults: Faults,
                 extras_bridge: str = "honour"):
        self.memory, self.faults, self.count, self.closed = memory, faults, 0, False
        self.pipeline = Pipeline(cap, flags_from_kwargs(kwargs, extras_bridge), memory, time_scale)
        if extras_bridge == "drop" and kwargs.get("extras"):
            print(f"INFO: Omni(...) extras {kwargs['extras']} parsed; the simulated default "
                  "diffusion stage config builds its own extras and drops them", file=sys.stderr)
        try:
            self.pipeline.init_parameters()
        except Exception:
            # As upstream's executor workers do: the worker's traceback (the CUDA OOM text) goes
            # to its log, here the runner's stderr; the caller sees only the orchestrator's word.
            traceback.print_exc(file=sys.stderr)
            raise RuntimeError("Orchestrator initialization failed: stage 0 worker exited "
                               "during init; see the worker log") from None

    def generate(self, request: dict) -> float:
        if self.closed:
            raise EngineClosed("the engine was shut down after a failed request")
        self.count += 1
        try:
            return self._generate(request)
        except Exception:
            # As upstream's Omni.generate: any failure shuts the engine down, then re-raises.
            self.closed = True
            raise

    def _generate(self, request: dict) -> float:
        if self.count in self.faults.crash:
            raise SystemExit("RuntimeError: CUDA error: an illegal memory access was encountered")
        if self.count in self.faults.hang:
            time.sleep(3600)
        if self.count in self.faults.fail:
            raise RuntimeError("simulated failure during generation")
        if self.count in self.faults.malformed:
            write_bytes_atomic(request["output"], b"\x89PNG not really")
            return 0.0
        references = [Path(p).read_bytes() for p in request["reference_paths"]]
        output = self.pipeline.generate(Request(
            prompt=request["prompt"], references=references, width=request["width"],
            height=request["height"], seed=request["seed"], steps=request["num_inference_steps"]))
        write_bytes_atomic(request["output"], output.png)
        return round(output.peak_memory_mb, 1)


def main(argv: list[str], cap: Capacity, memory, time_scale: float, faults: Faults,
         extras_bridge: str = "honour") -> int:
    return offline_runner.main(
        argv, engine=lambda model, kwargs: SimEngine(cap, kwargs, memory, time_scale, faults,
                                                     extras_bridge),
        prog="python -m omniprobe.sim offline")
