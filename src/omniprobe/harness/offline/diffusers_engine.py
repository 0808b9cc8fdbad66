"""The offline runner's Diffusers engine: Qwen-Image-2.1's `QwenImage21Pipeline` built from a
profile, with the pinned snapshot's weights or with random weights from committed configuration.

Like the runner it runs inside the probe's Python, importing the standard library, torch,
transformers and diffusers (torchao for an int8 DiT, accelerate for offload) only; never omniprobe.

Random weights are true to capacity and say nothing of the output: the same shapes allocate the same bytes,
so what fits, what OOMs, the peaks and the KV cache's size are the real model's, and the pictures
mean nothing. The build streams as a checkpoint's load does, each component placed before the next
is made (diffusers_build.py, beside this file, which also takes the host-memory figures).

The processor has no downloadable files here: its tokenizer is synthetic, a word-level vocabulary
with Qwen's special tokens at their real ids, so token counts are those of a synthetic tokenizer.
"""

from __future__ import annotations

import gc
import os
import sys
import time

from diffusers_build import (
    LOAD_ORDER,
    MIB,
    HostSampler,
    build_streamed,
    max_rss_mib,
    parameter_counts,
    parameters_b,
    pinned_mib,
    placed_host_figures,
)

# A capacity-search trial's pool limit, published in the runner's own environment: on the CPU
# there is no pool to cap, and a test double of the pipeline reads it there.
POOL_LIMIT_ENV = "OMNIPROBE_POOL_LIMIT_MIB"
OFFLOADS = ("none", "model-cpu", "group-leaf", "group-block")
QUANTISED_BY = {"text_encoder": "quantize_text_encoder", "transformer": "quantize_dit"}
# Qwen2/Qwen3 tokenizer's special tokens at their real ids (shared/diffusers-facts.md).
QWEN_SPECIAL_TOKENS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
    "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
}
_UNKNOWN_ID = 151700
_CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
                  "{{ c['text'] }}{% endfor %}<|im_end|>\n{% endfor %}")


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

    def __init__(self, pipe):
        import diffusers.pipelines.qwenimage21.pipeline_qwenimage21 as pipeline_module

        base = pipeline_module.QwenImage21KVCache
        made: list = []

        class Recorded(base):
            def __init__(self, num_layers: int):
                super().__init__(num_layers)
                made.append(self)

        pipeline_module.QwenImage21KVCache = Recorded
        self.made = made
        # The prompt's own text tokens, counted as the pipeline encodes it: each fixture has its
        # own prompt, so the references' share of the prefix is the prefix less these.
        self.text_tokens: list[int] = []
        encode = pipe.encode_prompt

        def counted(*args, **kwargs):
            embeds, mask, image_pads = encode(*args, **kwargs)
            tokens = int(mask[0].sum()) if mask is not None else embeds.shape[1]
            self.text_tokens.append(tokens - (int(image_pads[0].sum()) if image_pads is not None
                                              else 0))
            return embeds, mask, image_pads

        pipe.encode_prompt = counted

    def take(self) -> dict:
        """The call's conditional cache: bytes of its K and V tensors over the layers it filled,
        those layers of how many, the prefix tokens and the prompt's text tokens among them; empty
        when it made none (the cache off).
        A request that failed during prefill filled only some layers. The caches are released."""
        caches, self.made[:] = list(self.made), []
        # The first encoding is the prompt's; a negative prompt's would follow it.
        text, self.text_tokens[:] = self.text_tokens[:1], []
        if not caches:
            return {}
        layers = caches[0].layer_caches
        filled = [layer for layer in layers if layer.k is not None and layer.v is not None]
        if not filled:
            return {"kv_cache_layers": 0, "kv_cache_layers_total": len(layers)}
        total = sum(t.numel() * t.element_size() for layer in filled for t in (layer.k, layer.v))
        return {"kv_cache_bytes": total, "kv_cache_layers": len(filled),
                "kv_cache_layers_total": len(layers), "prefix_tokens": int(filled[0].k.shape[1]),
                "prompt_text_tokens": text[0] if text else None}


class DiffusersEngine:
    """QwenImage21Pipeline under one profile; a failed request (an OOM) leaves it usable."""

    peak_source = "torch-reserved"  # max_memory_reserved over the request
    survives_failure = True  # unlike Omni.generate, a Diffusers pipeline is not closed by an OOM

    def __init__(self, model: str, kwargs: dict, *, open_image, save_png):
        import torch

        self.torch, self.open_image, self.save_png = torch, open_image, save_png
        profile, weights = kwargs["profile"], kwargs["weights"]
        self.profile = profile
        # The condition size, resolved by hosts.toml (the profile's, else its defaults'); none
        # given: the pipeline's own default.
        resolution = kwargs.get("output_resolution")
        self.sizing = {} if resolution is None else {"output_resolution": int(resolution)}
        offload = profile.get("offload", "none")
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        refusal = profile_refusal(profile, self.device == "cuda")
        if refusal is not None:
            raise ProfileError(refusal)
        dtype = getattr(torch, profile.get("dtype", "bfloat16"))
        quantised = {name for name, key in QUANTISED_BY.items()
                     if profile.get(key) == "int8-weight-only"}
        started = time.monotonic()
        from diffusers import QwenImage21Pipeline

        if weights["kind"] == "random":
            self.build_path = "random-streamed"
            configs = weights["configs"]
            parts = build_streamed(configs, dtype, int(weights["seed"]),
                                   init_device=self.device, quantised=quantised,
                                   keep_on=self.device if offload == "none" else "cpu",
                                   place=self._place_component)
            from diffusers import FlowMatchEulerDiscreteScheduler

            self.pipe = QwenImage21Pipeline(
                scheduler=FlowMatchEulerDiscreteScheduler(**configs.get("scheduler", {})),
                processor=synthetic_processor(configs["processor"]), **parts)
        elif weights["kind"] == "snapshot":
            # from_pretrained's own load path: the whole pipeline, then quantised and placed.
            self.build_path = "from-pretrained"
            self.pipe = QwenImage21Pipeline.from_pretrained(model, torch_dtype=dtype,
                                                            local_files_only=True)
            for name in LOAD_ORDER:
                module = getattr(self.pipe, name)
                if name in quantised:
                    from torchao.quantization import Int8WeightOnlyConfig, quantize_

                    quantize_(module, Int8WeightOnlyConfig(),
                              device=None if self.device == "cpu" else self.device)
                    module.to("cpu")
                self._place_component(name, module)
        else:
            raise ProfileError(f"weights {weights['kind']!r}: expected 'random' or 'snapshot'")
        self.parameters_b = {name: parameters_b(getattr(self.pipe, name)) for name in LOAD_ORDER}
        self._place_pipeline(offload)
        gc.collect()
        self.build_s = round(time.monotonic() - started, 3)
        self.build_peak_mib = self._peaks()[1]
        self.resident_mib = (round(torch.cuda.memory_allocated() / MIB, 1)
                             if self.device == "cuda" else None)
        self.host = placed_host_figures(torch, [getattr(self.pipe, n) for n in LOAD_ORDER])
        self.expandable_segments = expandable_segments_active(torch)
        self.kv = KvCacheRecorder(self.pipe)

    def _place_component(self, name: str, module) -> None:
        """Group offload: the component's hooks, applied as soon as it is complete (the
        profile's stream settings as apply_group_offloading takes them)."""
        offload = self.profile.get("offload", "none")
        if offload not in ("group-leaf", "group-block"):
            return
        from diffusers.hooks import apply_group_offloading

        torch = self.torch
        extra = ({} if offload == "group-leaf"
                 else {"num_blocks_per_group": int(self.profile.get("blocks_per_group") or 1)})
        apply_group_offloading(
            module, onload_device=torch.device("cuda"), offload_device=torch.device("cpu"),
            offload_type="leaf_level" if offload == "group-leaf" else "block_level",
            use_stream=bool(self.profile.get("use_stream")),
            record_stream=bool(self.profile.get("record_stream")),
            low_cpu_mem_usage=bool(self.profile.get("low_cpu_mem_usage")), **extra)

    def _place_pipeline(self, offload: str) -> None:
        pipe, torch = self.pipe, self.torch
        if offload == "none":
            pipe.to(self.device)  # a streamed build left it there already
        elif offload == "model-cpu":
            pipe.enable_model_cpu_offload()
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def facts(self) -> dict:
        """What the init event records of the build."""
        return {"parameters_b": self.parameters_b, "build_s": self.build_s,
                "build_peak_mib": self.build_peak_mib, "resident_mib": self.resident_mib,
                "expandable_segments": self.expandable_segments, "build_path": self.build_path,
                **self.host}

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
            torch.cuda.reset_peak_host_memory_stats()
            start = round(torch.cuda.memory_allocated() / MIB, 1)
        images = [self.open_image(path) for path in request["references"]]
        host = HostSampler()
        try:
            with host:
                out = self.pipe(
                    prompt=request["prompt"], image=images or None, height=request["height"],
                    width=request["width"], num_inference_steps=request["num_inference_steps"],
                    true_cfg_scale=request["true_cfg_scale"],
                    generator=torch.Generator("cpu").manual_seed(request["seed"]),
                    output_type="pil", use_kv_cache=bool(self.profile.get("use_kv_cache", True)),
                    **self.sizing)
        finally:
            allocated, reserved = self._peaks()
            self.last = {"peak_mib": reserved, "peak_allocated_mib": allocated,
                         "start_allocated_mib": start, **self.kv.take(),
                         "max_rss_mib": max_rss_mib(), "host_peak_mib": host.peak_mib,
                         "host_end_mib": host.end_mib,
                         "pinned_host_peak_mib": pinned_mib(torch, "allocated_bytes.peak"),
                         **self._outside_pool()}
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


def profile_refusal(profile: dict, cuda: bool) -> str | None:
    """Why the engine cannot build `profile` on this machine, in the words it refuses it with
    (the harness asks before any runner starts, through `--versions PROFILES`); None: it can."""
    offload = profile.get("offload", "none")
    if offload not in OFFLOADS:
        return f"offload {offload!r}: expected one of {', '.join(OFFLOADS)}"
    if not cuda and offload != "none":
        return f"offload {offload!r} needs a CUDA device; this machine has none"
    return None


def asked_facts(profiles: dict[str, dict], configs: dict | None) -> dict:
    """What the engine would do, asked before anything is built: each profile it would refuse
    here, with its words (torch is imported for it), and, for a random build's configs, each
    component's parameters, counted on the meta device."""
    import torch

    cuda = torch.cuda.is_available()
    found = {name: profile_refusal(p, cuda) for name, p in profiles.items()}
    facts: dict = {"refusals": {name: why for name, why in found.items() if why is not None}}
    if configs:
        facts["parameters"] = parameter_counts(configs)
    return facts


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
