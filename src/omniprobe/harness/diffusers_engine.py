"""The offline runner's Diffusers engine: Qwen-Image-2.1's `QwenImage21Pipeline` built from a
profile, with the pinned snapshot's weights or with random weights from committed configuration.

Like the runner it runs inside the probe's Python, importing the standard library, torch,
transformers and diffusers (torchao for an int8 DiT, accelerate for offload) only; never omniprobe.

Random weights are true to capacity and say nothing of the output: the same shapes allocate the same bytes,
so what fits, what OOMs, the peaks and the KV cache's size are the real model's, and the pictures
mean nothing. Every component is made on the meta device and then filled tensor by tensor: each
tensor is drawn on the init device (the GPU when there is one, from one recorded seed) and moved
to host memory before the next, so the build never holds more than one tensor on the GPU and runs
under an emulated card's cap. The build is not the checkpoint's load path: its peak never speaks
to init.

The processor has no downloadable files here: its tokenizer is synthetic, a word-level vocabulary
with Qwen's special tokens at their real ids, so token counts are those of a synthetic tokenizer.
"""

from __future__ import annotations

import gc
import os
import resource
import sys
import time
from typing import Any

MIB = 1024**2
# A capacity-search trial's pool limit, published in the runner's own environment: on the CPU
# there is no pool to cap, and a test double of the pipeline reads it there.
POOL_LIMIT_ENV = "OMNIPROBE_POOL_LIMIT_MIB"
OFFLOADS = ("none", "model-cpu", "group-leaf-stream", "group-block")
# Qwen2/Qwen3 tokenizer's special tokens at their real ids (shared/diffusers-facts.md).
QWEN_SPECIAL_TOKENS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
    "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
}
_UNKNOWN_ID = 151700
_CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
                  "{{ c['text'] }}{% endfor %}<|im_end|>\n{% endfor %}")
_INIT_STD = 0.02  # any finite spread does: the values never matter, only the shapes


class ProfileError(ValueError):
    """A profile or weights spec the engine cannot honour (raised before anything is built)."""


def synthetic_tokenizer():
    """A word-level tokenizer over ids 0..151642 plus Qwen's special tokens at their ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(min(QWEN_SPECIAL_TOKENS.values()))}
    vocab.update(QWEN_SPECIAL_TOKENS)
    vocab["<unk>"] = _UNKNOWN_ID
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>",
                                        pad_token="<|endoftext|>", eos_token="<|im_end|>")
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_SPECIAL_TOKENS)})
    return tokenizer


def synthetic_processor(spec: dict):
    """Qwen3-VL's processor from transformers' classes: `spec` holds the image processor's
    settings (its size limits must admit the pipeline's condition images)."""
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    image = Qwen2VLImageProcessor(**spec["image_processor"])
    video = Qwen3VLVideoProcessor(**spec["video_processor"])
    return Qwen3VLProcessor(image_processor=image, tokenizer=synthetic_tokenizer(),
                            video_processor=video, chat_template=_CHAT_TEMPLATE)


def materialise_random(module, dtype, init_device: str, seed: int,
                       pool_elements: int = 1 << 26) -> None:
    """Fill every parameter still on the meta device with random values of `dtype` in host
    memory. One pool of values is drawn on `init_device`
    from `seed` and copied to the host once; each tensor takes the pool's values from a running
    offset (wrapping), so the build holds at most the pool on the GPU and costs little more than
    the host memory it fills. Shared parameters are made once."""
    import torch

    pending = sum(p.numel() for p in module.parameters() if p.device.type == "meta")
    generator = torch.Generator(device=init_device).manual_seed(seed)
    pool = torch.empty(max(1, min(pool_elements, pending)), dtype=dtype, device=init_device)
    pool.normal_(0.0, _INIT_STD, generator=generator)
    pool = pool.to("cpu")
    made: dict[int, Any] = {}
    offset = 0
    with torch.no_grad():
        for sub in module.modules():
            for name, param in list(sub._parameters.items()):
                if param is None:
                    continue
                if id(param) in made:
                    sub._parameters[name] = made[id(param)]
                    continue
                if param.device.type == "meta":
                    value = torch.empty(param.shape, dtype=dtype)
                    offset = _fill_from(value.view(-1), pool, offset)
                else:
                    value = param.data.to(dtype=dtype, device="cpu")
                made[id(param)] = sub._parameters[name] = torch.nn.Parameter(
                    value, requires_grad=False)


def _fill_from(flat, pool, offset: int) -> int:
    """Copy the pool into `flat` from `offset` on, wrapping; the offset after it."""
    done, size = 0, pool.numel()
    while done < flat.numel():
        take = min(flat.numel() - done, size - offset)
        flat[done:done + take].copy_(pool[offset:offset + take])
        done += take
        offset = (offset + take) % size
    return offset


def _parameters_b(module) -> float:
    return round(sum(p.numel() for p in module.parameters()) / 1e9, 4)


def build_random(configs: dict, dtype, init_device: str, seed: int):
    """The pipeline's components from committed configs, random weights, on the host."""
    import torch
    from accelerate import init_empty_weights
    from diffusers import (
        AutoencoderKLQwenImage21,
        FlowMatchEulerDiscreteScheduler,
        QwenImage21Transformer2DModel,
    )
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    with init_empty_weights(include_buffers=False):
        text_encoder = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**configs["text_encoder"]))
        transformer = QwenImage21Transformer2DModel(**configs["transformer"])
        vae = AutoencoderKLQwenImage21(**configs["vae"])
    # One seed, one stream per component in a fixed order: the build is reproducible.
    for offset, module in enumerate((text_encoder, transformer, vae)):
        materialise_random(module, dtype, init_device, seed + offset)
        module.eval()
    if init_device != "cpu":
        torch.cuda.synchronize()
    scheduler = FlowMatchEulerDiscreteScheduler(**configs.get("scheduler", {}))
    return text_encoder, transformer, vae, scheduler


def expandable_segments_active(torch) -> bool | None:
    """Read the allocator's setting back: whether its segments are expandable (None: no CUDA or
    no segment yet to tell)."""
    if not torch.cuda.is_available():
        return None
    probe = torch.empty(1, device="cuda")  # at least one segment to inspect
    segments = torch.cuda.memory._snapshot().get("segments", [])
    del probe
    flags = [s.get("is_expandable") for s in segments if "is_expandable" in s]
    return bool(flags and all(flags)) if flags else None


class KvCacheRecorder:
    """Counts the pipeline's conditioning KV caches: the pipeline makes them per call, so the
    module's class is replaced by a subclass that keeps each one it makes until `take`."""

    def __init__(self):
        import diffusers.pipelines.qwenimage21.pipeline_qwenimage21 as pipeline_module

        base = pipeline_module.QwenImage21KVCache
        made: list = []

        class Recorded(base):
            def __init__(self, num_layers: int):
                super().__init__(num_layers)
                made.append(self)

        pipeline_module.QwenImage21KVCache = Recorded
        self.made = made

    def take(self) -> dict:
        """The call's conditional cache: bytes of its K and V tensors over the layers it filled,
        those layers of how many, and the prefix tokens; empty when it made none (the cache off).
        A request that failed during prefill filled only some layers. The caches are released."""
        caches, self.made[:] = list(self.made), []
        if not caches:
            return {}
        layers = caches[0].layer_caches
        filled = [layer for layer in layers if layer.k is not None and layer.v is not None]
        if not filled:
            return {"kv_cache_layers": 0, "kv_cache_layers_total": len(layers)}
        total = sum(t.numel() * t.element_size() for layer in filled for t in (layer.k, layer.v))
        return {"kv_cache_bytes": total, "kv_cache_layers": len(filled),
                "kv_cache_layers_total": len(layers), "prefix_tokens": int(filled[0].k.shape[1])}


class DiffusersEngine:
    """QwenImage21Pipeline under one profile; a failed request (an OOM) leaves it usable."""

    peak_source = "torch-reserved"  # max_memory_reserved over the request
    survives_failure = True  # unlike Omni.generate, a Diffusers pipeline is not closed by an OOM

    def __init__(self, model: str, kwargs: dict, *, open_image, save_png):
        import torch

        self.torch, self.open_image, self.save_png = torch, open_image, save_png
        profile, weights = kwargs["profile"], kwargs["weights"]
        self.profile = profile
        offload = profile.get("offload", "none")
        if offload not in OFFLOADS:
            raise ProfileError(f"offload {offload!r}: expected one of {', '.join(OFFLOADS)}")
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cpu" and offload != "none":
            raise ProfileError(f"offload {offload!r} needs a CUDA device; this machine has none")
        dtype = getattr(torch, profile.get("dtype", "bfloat16"))
        started = time.monotonic()
        if weights["kind"] == "random":
            text_encoder, transformer, vae, scheduler = build_random(
                weights["configs"], dtype, self.device, int(weights["seed"]))
            processor = synthetic_processor(weights["configs"]["processor"])
            from diffusers import QwenImage21Pipeline

            self.pipe = QwenImage21Pipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder,
                                            processor=processor, transformer=transformer)
        elif weights["kind"] == "snapshot":
            from diffusers import QwenImage21Pipeline

            self.pipe = QwenImage21Pipeline.from_pretrained(model, torch_dtype=dtype,
                                                            local_files_only=True)
        else:
            raise ProfileError(f"weights {weights['kind']!r}: expected 'random' or 'snapshot'")
        self.parameters_b = {name: _parameters_b(getattr(self.pipe, name))
                             for name in ("text_encoder", "transformer", "vae")}
        if profile.get("quantize_dit") == "int8-weight-only":
            from torchao.quantization import Int8WeightOnlyConfig, quantize_

            quantize_(self.pipe.transformer, Int8WeightOnlyConfig(),
                      device=None if self.device == "cpu" else self.device)
            self.pipe.transformer.to("cpu")
        self._place(offload)
        gc.collect()
        self.build_s = round(time.monotonic() - started, 3)
        self.build_peak_mib = self._peaks()[1]
        self.resident_mib = (round(torch.cuda.memory_allocated() / MIB, 1)
                             if self.device == "cuda" else None)
        self.expandable_segments = expandable_segments_active(torch)
        self.kv = KvCacheRecorder()

    def _place(self, offload: str) -> None:
        pipe, torch = self.pipe, self.torch
        if offload == "none":
            pipe.to(self.device)
        elif offload == "model-cpu":
            pipe.enable_model_cpu_offload()
        else:
            from diffusers.hooks import apply_group_offloading

            level = {"group-leaf-stream": "leaf_level", "group-block": "block_level"}[offload]
            extra = ({"use_stream": True} if level == "leaf_level"
                     else {"num_blocks_per_group": int(self.profile.get("blocks_per_group") or 1)})
            for name in ("text_encoder", "transformer", "vae"):
                apply_group_offloading(getattr(pipe, name), onload_device=torch.device("cuda"),
                                       offload_device=torch.device("cpu"), offload_type=level,
                                       **extra)
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def facts(self) -> dict:
        """What the init event records of the build."""
        return {"parameters_b": self.parameters_b, "build_s": self.build_s,
                "build_peak_mib": self.build_peak_mib, "resident_mib": self.resident_mib,
                "expandable_segments": self.expandable_segments}

    def _peaks(self) -> tuple[float | None, float | None]:
        torch = self.torch
        if self.device != "cuda":
            return None, None
        return (round(torch.cuda.max_memory_allocated() / MIB, 1),
                round(torch.cuda.max_memory_reserved() / MIB, 1))

    def generate(self, request: dict) -> dict:
        torch = self.torch
        start = None
        if self.device == "cuda":
            # The pool the last request left cached would count in this one's reserved peak.
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            start = round(torch.cuda.memory_allocated() / MIB, 1)
        images = [self.open_image(path) for path in request["references"]]
        try:
            out = self.pipe(
                prompt=request["prompt"], image=images or None, height=request["height"],
                width=request["width"], num_inference_steps=request["num_inference_steps"],
                true_cfg_scale=request["true_cfg_scale"],
                generator=torch.Generator("cpu").manual_seed(request["seed"]),
                output_type="pil", use_kv_cache=bool(self.profile.get("use_kv_cache", True)),
                output_resolution=int(self.profile.get("output_resolution") or 1024))
        finally:
            allocated, reserved = self._peaks()
            self.last = {"peak_mib": reserved, "peak_allocated_mib": allocated,
                         "start_allocated_mib": start, **self.kv.take(),
                         "max_rss_mib": max_rss_mib(), **self._outside_pool()}
        self.save_png(out.images[0], request["output"])
        return self.last

    def set_pool_limit(self, limit_mib: int) -> None:
        """A capacity-search trial: from now on torch's pool may reserve `limit_mib` and no more,
        and mem_get_info answers as a card with that pool would (its total the limit)."""
        os.environ[POOL_LIMIT_ENV] = str(limit_mib)
        torch = self.torch
        if self.device != "cuda":
            return
        torch.cuda.empty_cache()
        device = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit_mib * MIB / total), device)
        limit = limit_mib * MIB

        def mem_get_info(device=None):
            return max(0, limit - torch.cuda.memory_reserved(device)), limit

        torch.cuda.mem_get_info = torch.cuda.memory.mem_get_info = mem_get_info

    def _outside_pool(self) -> dict:
        """What NVML lists for this process, and how much of it lies outside torch's pool (the
        CUDA context, kernels loaded as they run, other libraries' own allocations), read at one
        moment; empty where NVML cannot say."""
        if self.device != "cuda":
            return {}
        process = process_gpu_mib()
        if process is None:
            return {}
        reserved = self.torch.cuda.memory_reserved() / MIB
        return {"process_mib": round(process, 1),
                "outside_pool_mib": round(max(0.0, process - reserved), 1)}

    def recover(self) -> None:
        """After a failed request (called once its exception and traceback are gone): put the
        offloaded models back where the profile keeps them, release what the request held,
        keep the pipeline."""
        if self.profile.get("offload") == "model-cpu":
            self.pipe.maybe_free_model_hooks()
        gc.collect()
        if self.device == "cuda":
            self.torch.cuda.empty_cache()


def process_gpu_mib() -> float | None:
    """This process's device memory as NVML lists it (None: no NVML, or not listed here)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        index = int((os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0])
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        listed = (pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                  + pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
    except (pynvml.NVMLError, ValueError):
        return None
    used = next((p.usedGpuMemory for p in listed if p.pid == os.getpid()), None)
    return None if used is None else used / MIB


def max_rss_mib() -> float:
    """The process's peak resident set so far (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def environment_facts() -> dict:
    """What `--versions` prints: the packages this engine runs on (nothing is imported but
    importlib.metadata; the harness reads the allocator variable back from torch itself)."""
    from importlib import metadata

    versions = {}
    for name in ("torch", "torchvision", "transformers", "diffusers", "accelerate", "torchao",
                 "tokenizers", "safetensors", "pillow", "numpy", "nvidia-ml-py"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"packages": versions,
            "python": ".".join(map(str, sys.version_info[:3])),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
