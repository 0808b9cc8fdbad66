"""The simulated pipeline: the capacity model's allocations, in a diffusion server's order.

Init allocates the resident weights in parameter-sized chunks; a request allocates its working
memory, one cache block per reference, then a spike at every denoise step. Whichever allocation
does not fit raises the backend's out-of-memory error from here, so tracebacks end in this file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from omniprobe.sim.capacity import Capacity
from omniprobe.sim.memory import MIB


class UnsupportedFlags(ValueError):
    """The server flags ask for something the capacity model does not describe."""


# prefix_kv_cache_dtype -> the share of the conditioning KV cache it saves (fp8_v: V in 8 bits).
KV_SAVINGS = {"auto": 0.0, "fp8_v": 0.25, "fp8": 0.5, "fp8_e4m3": 0.5}


@dataclass(frozen=True)
class Flags:
    precision: str
    cpu_offload: bool
    layerwise: bool
    kv_cache_dtype: str = "auto"


@dataclass(frozen=True)
class Request:
    prompt: str
    references: list[bytes]
    width: int
    height: int
    seed: int
    steps: int


@dataclass(frozen=True)
class Output:
    png: bytes
    peak_memory_mb: float
    denoise_s: float


def resident_mib(cap: Capacity, flags: Flags) -> int:
    """Weights on the GPU after init; CPU offload keeps the text encoder in host memory."""
    if flags.precision not in cap.dit_mib:
        raise UnsupportedFlags(f"quantization {flags.precision!r} is not in the capacity model "
                               f"(modelled: {', '.join(cap.dit_mib)})")
    encoder = 0 if flags.cpu_offload else cap.encoder_mib[flags.precision]
    return cap.dit_mib[flags.precision] + encoder


def reference_cost_mib(cap: Capacity, flags: Flags) -> int:
    """Cache per reference image; a quantized conditioning KV takes part of it off."""
    if flags.kv_cache_dtype not in KV_SAVINGS:
        raise UnsupportedFlags(f"prefix_kv_cache_dtype {flags.kv_cache_dtype!r} is not in the "
                               f"capacity model (modelled: {', '.join(KV_SAVINGS)})")
    return cap.reference_mib - int(cap.kv_reference_mib * KV_SAVINGS[flags.kv_cache_dtype])


def init_chunks(total_mib: int, chunk_mib: int) -> list[int]:
    full, rest = divmod(total_mib, chunk_mib)
    return [chunk_mib] * full + ([rest] if rest else [])


def request_peak_mib(cap: Capacity, flags: Flags, references: int) -> int:
    """The modelled allocated memory at a request's spike (weights included)."""
    working = cap.activation_mib + (cap.layerwise_mib if flags.layerwise else 0)
    return (resident_mib(cap, flags) + working + references * reference_cost_mib(cap, flags)
            + cap.spike_mib)


class Pipeline:
    def __init__(self, cap: Capacity, flags: Flags, memory, time_scale: float = 1.0):
        resident_mib(cap, flags)
        reference_cost_mib(cap, flags)
        self.cap, self.flags, self.memory, self.time_scale = cap, flags, memory, time_scale
        self.weights: list = []

    def _sleep(self, seconds: float) -> None:
        if seconds * self.time_scale > 0:
            time.sleep(seconds * self.time_scale)

    def init_parameters(self) -> None:
        chunks = init_chunks(resident_mib(self.cap, self.flags), self.cap.init_chunk_mib)
        for chunk in chunks:
            self.weights.append(self.memory.alloc(chunk * MIB))
            self._sleep(self.cap.init_s / len(chunks))

    def generate(self, request: Request) -> Output:
        self.memory.start_request()
        blocks: list = []
        try:
            blocks.append(self.memory.alloc(self.cap.activation_mib * MIB))
            if self.flags.layerwise:
                blocks.append(self.memory.alloc(self.cap.layerwise_mib * MIB))
            self.encode_references(blocks, len(request.references))
            started = time.perf_counter()
            for _ in range(request.steps):
                self.predict_noise()
            denoise_s = time.perf_counter() - started
        finally:
            self.memory.release(blocks)
        # Imported here: the preflight's parse and a server that only inits never draw a picture.
        from omniprobe.sim import images

        render = (images.collapsed if self.flags.precision in self.cap.collapsed else images.sound)
        image = render(request.prompt, request.references, request.seed, request.width,
                       request.height)
        if self.flags.kv_cache_dtype != "auto":
            image = images.kv_rounding(image, self.flags.kv_cache_dtype, request.seed)
        return Output(images.png(image), self.memory.request_peak_mib(), denoise_s)

    def encode_references(self, blocks: list, count: int) -> None:
        for _ in range(count):
            blocks.append(self.memory.alloc(reference_cost_mib(self.cap, self.flags) * MIB))
            self._sleep(self.cap.reference_s)

    def predict_noise(self) -> None:
        spike = [self.image_mlp()]
        self._sleep(self.cap.step_s)
        self.memory.release(spike)

    def image_mlp(self):
        return self.memory.alloc(self.cap.spike_mib * MIB)
