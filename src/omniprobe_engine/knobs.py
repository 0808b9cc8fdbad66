"""Every setting of a Diffusers profile, once: its name, type, default, how the engine applies it,
what it is refused with, and what it affects (GPU memory, host memory, speed).

hosts.toml's profiles are validated by a model made from this table (omniprobe/config/
diffusers.py DiffusersProfile); the engine reads a profile's values through `setting`; the
analysis groups profiles by what the knobs affect (`host_footprint_knobs`). None
of them restates a knob. Standard library only: the runner imports it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omniprobe_engine.kv_host import HOST_PLACEMENTS

GPU_MEMORY, HOST_MEMORY, SPEED = "gpu-memory", "host-memory", "speed"
REQUIRED = object()  # a profile must state it
OFFLOADS = ("none", "model-cpu", "group-leaf", "group-block")
GROUP_OFFLOADS = ("group-leaf", "group-block")
INT8 = "int8-weight-only"
PINNED_WEIGHTS = ("blocks", "packed")


@dataclass(frozen=True)
class Knob:
    name: str
    value: type  # bool, int, float, str; list: of ints
    description: str
    applied: str  # how the engine applies it to the pipeline or the call
    affects: tuple[str, ...]
    default: Any = REQUIRED
    choices: tuple[Any, ...] = ()
    nullable: bool = False
    bounds: dict[str, Any] = field(default_factory=dict)  # the value's (a list's: its own)
    item_bounds: dict[str, Any] = field(default_factory=dict)  # a list's items'
    refused: str = ""  # when a profile setting it is refused, before any runner starts
    # Read by the request (sampling), not the build: a profile may take it from the defaults.
    sampling: bool = False


KNOBS: tuple[Knob, ...] = (
    Knob("pipeline", str, default="QwenImage21Pipeline", bounds={"pattern": r"^[A-Z][A-Za-z0-9]*Pipeline$"},
         description="The diffusers pipeline class, by name; the engine builds it from the host's "
                     "component configs, and a pipeline no adapter serves "
                     "(omniprobe_engine/adapters/) is refused before any attempt.",
         applied="diffusers.<pipeline>(scheduler=..., **components), its adapter by this name",
         affects=(GPU_MEMORY, HOST_MEMORY, SPEED),
         refused="a pipeline no adapter serves"),
    Knob("dtype", str, default="bfloat16", choices=("bfloat16", "float16", "float32"),
         description="The dtype every component is built in.",
         applied="torch_dtype of the build (random weights: each unit filled in it)",
         affects=(GPU_MEMORY, HOST_MEMORY, SPEED)),
    Knob("offload", str, choices=OFFLOADS,
         description="none: every component on the GPU; model-cpu: enable_model_cpu_offload() "
                     "(whole components move to the GPU in turn); group-leaf: "
                     "diffusers.hooks.apply_group_offloading at leaf level; group-block: the same "
                     "at block level, one block per group. Streams are use_stream's ("
                     "'group-leaf-stream', the value before, reads as group-leaf with streams).",
         applied="pipe.to(device) | pipe.enable_model_cpu_offload() | apply_group_offloading "
                 "per component as it is built (offload_type leaf_level or block_level, "
                 "num_blocks_per_group 1)",
         affects=(GPU_MEMORY, HOST_MEMORY, SPEED),
         refused="anything but none on a machine without CUDA; a placement the adapter's "
                 "pipeline does not allow"),
    Knob("use_stream", bool, default=False,
         description="Group offload only: apply_group_offloading's use_stream, CUDA streams that "
                     "prefetch the next group; with low_cpu_mem_usage false every offloaded "
                     "tensor is copied into page-locked host memory, which no swap can take.",
         applied="apply_group_offloading(use_stream=...)", affects=(HOST_MEMORY, SPEED),
         refused="set without group offload"),
    Knob("low_cpu_mem_usage", bool, default=False,
         description="Group offload with streams only: pin each tensor on the fly as it is "
                     "onloaded instead of keeping a page-locked copy.",
         applied="apply_group_offloading(low_cpu_mem_usage=...)", affects=(HOST_MEMORY, SPEED),
         refused="set without group offload with streams"),
    Knob("record_stream", bool, default=False,
         description="Group offload with streams only: apply_group_offloading's record_stream.",
         applied="apply_group_offloading(record_stream=...)", affects=(GPU_MEMORY, SPEED),
         refused="set without group offload with streams"),
    Knob("pinned_weights", str, default="blocks", choices=PINNED_WEIGHTS,
         description="Group offload with streams that keeps page-locked copies "
                     "(low_cpu_mem_usage false) only: blocks, each offloaded tensor pinned as a "
                     "block of its own, which torch's pinned allocator rounds up to a power of "
                     "two; packed, each component's copies carved out of a few page-locked slabs "
                     "sized to its bytes (pinned_weights.py), so the host holds about the "
                     "weights' own bytes.",
         applied="diffusers' ModuleGroup._to_cpu replaced while apply_group_offloading runs on "
                 "each component",
         affects=(HOST_MEMORY,),
         refused="packed without group offload with streams and low_cpu_mem_usage false"),
    Knob("allocator", str, default=None, nullable=True,
         bounds={"pattern": r"^[a-z_]+:[A-Za-z0-9_.]+(,[a-z_]+:[A-Za-z0-9_.]+)*$"},
         description="PyTorch's allocator setting (e.g. 'expandable_segments:True'), written in "
                     "whichever of PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF the runner's torch "
                     "reads it back through, and read back from the allocator after the build.",
         applied="the runner's environment, before torch is imported", affects=(GPU_MEMORY,),
         refused="a setting the runner's torch does not read back"),
    Knob("use_kv_cache", bool,
         description="The pipeline's conditioning KV cache (use_kv_cache).",
         applied="the call's use_kv_cache", affects=(GPU_MEMORY, SPEED),
         refused="true for a pipeline that keeps no conditioning cache"),
    Knob("kv_placement", str, default="gpu",
         choices=("gpu", *HOST_PLACEMENTS),
         description="Where the conditioning KV cache lives between steps, where use_kv_cache "
                     "keeps one: gpu, the pipeline's own; host-pinned or host-pageable, host "
                     "copies each step copies back to the GPU one layer at a time (kv_host.py); "
                     "host-pinned-packed, pinned, each layer's K and V carved out of a few "
                     "slabs sized to the cache instead of a block each rounded up to a power of "
                     "two.",
         applied="the pipeline's layer cache class replaced by one that stores K and V in host "
                 "memory and hands each use a temporary device copy",
         affects=(GPU_MEMORY, HOST_MEMORY, SPEED),
         refused="a host placement without use_kv_cache; a pinned one without CUDA"),
    Knob("release_kv_before_decode", bool, default=False,
         description="Free the conditioning KV cache's tensors after the last denoising step, "
                     "once the recorder has counted them, so the decode's peak does not come on "
                     "top of the whole cache (the pipeline itself keeps it until it returns).",
         applied="callback_on_step_end at the last step: the recorder counts the cache, then "
                 "frees each layer's K and V",
         affects=(GPU_MEMORY,), refused="without use_kv_cache (there is no cache to release)"),
    Knob("quantize_dit", str, default=None, nullable=True, choices=(INT8,),
         description="torchao int8 weight-only quantization of the DiT.",
         applied="torchao quantize_(transformer, Int8WeightOnlyConfig()), unit by unit as built",
         affects=(GPU_MEMORY, HOST_MEMORY, SPEED)),
    Knob("quantize_text_encoder", str, default=None, nullable=True, choices=(INT8,),
         description="torchao int8 weight-only quantization of the text encoder (its linear "
                     "layers), as it is built.",
         applied="torchao quantize_(text_encoder, Int8WeightOnlyConfig()), unit by unit as built",
         affects=(GPU_MEMORY, HOST_MEMORY, SPEED),
         refused="a text encoder class torchao's int8 weight-only quantization is not known to "
                 "take"),
    Knob("vae_tiling", bool, default=False,
         description="Decode (and encode) through the VAE in tiles: vae.enable_tiling().",
         applied="pipe.vae.enable_tiling() once the pipeline is built",
         affects=(GPU_MEMORY, SPEED), refused="a VAE class without enable_tiling"),
    Knob("output_resolution", int, default=None, nullable=True, bounds={"gt": 0, "le": 4096},
         description="The side the pipeline resizes condition images to (area "
                     "output_resolution²); null: [diffusers_profile_defaults] output_resolution.",
         applied="the call's output_resolution", affects=(GPU_MEMORY, SPEED),
         refused="set for a pipeline that sizes its condition images itself"),
    Knob("steps", int, default=None, nullable=True, bounds={"ge": 1, "le": 1000}, sampling=True,
         description="Denoising steps, in place of the fixtures' sampling.",
         applied="the call's num_inference_steps", affects=(SPEED,)),
    Knob("true_cfg_scale", float, default=None, nullable=True, bounds={"ge": 0, "le": 100},
         sampling=True, description="Classifier-free guidance, in place of the fixtures' sampling.",
         applied="the call's true_cfg_scale (or its adapter's guidance argument)",
         affects=(SPEED,)),
    Knob("seeds", list, default=None, nullable=True, bounds={"min_length": 1},
         item_bounds={"ge": 0, "le": 2**32 - 1}, sampling=True,
         description="Seeds, in place of the fixtures' sampling: each 0 to 2**32-1, once.",
         applied="the call's generator, one request per seed", affects=()),
)
BY_NAME = {knob.name: knob for knob in KNOBS}


def setting(profile: dict, name: str) -> Any:
    """A profile's value of a knob: its own, else the knob's default (KeyError: a knob it must
    state and does not, or no knob of that name)."""
    knob = BY_NAME[name]
    if name in profile:
        return profile[name]
    if knob.default is REQUIRED:
        raise KeyError(f"profile lacks {name!r}, which it must state")
    return knob.default


def host_footprint_knobs() -> tuple[str, ...]:
    """The knobs that decide what a profile holds in host memory (its placement and precision)."""
    return tuple(k.name for k in KNOBS if HOST_MEMORY in k.affects and k.name != "pipeline")
