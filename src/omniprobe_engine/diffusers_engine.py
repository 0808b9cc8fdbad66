"""The offline runner's Diffusers engine: any diffusers pipeline a profile names, built the way
`DiffusionPipeline.from_pretrained` reads model_index.json (the pipeline class by name, each
component's class by name, the pipeline made from its components by keyword), with the pinned
snapshot's weights or with random weights from the committed configs (models/<model>/<variant>/
<component>.json: each a "class" and its "config"). What one model family needs beyond that (a
synthetic tokenizer's special tokens, the call's own arguments, the recorder of its KV cache, what
its capabilities refuse, what a failed request leaves) is its adapter's: an instance of a
`DiffusersAdapter` subclass in adapters/.

Like the runner it runs in the runner's Python, importing the standard library, torch,
transformers and diffusers (torchao for an int8 DiT, accelerate for offload) only; never omniprobe.

Random weights are true to capacity and say nothing of the output: the same shapes allocate the same bytes,
so what fits, what OOMs, the peaks and the KV cache's size are the real model's, and the pictures
mean nothing. The build streams as a checkpoint's load does, each component placed before the next
is made (diffusers_build.py, which also takes the host-memory figures).

Tokenizers and processors have no downloadable files here: the adapter makes them synthetic, so
token counts are those of a synthetic tokenizer.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from contextlib import nullcontext

from omniprobe_engine.adapters import adapter_for
from omniprobe_engine.diffusers_build import (
    MIB,
    HostSampler,
    build_streamed,
    max_rss_mib,
    parameter_counts,
    parameters_b,
    pinned_mib,
    placed_host_figures,
    release_pinned_cache,
    resolve_class,
)
from omniprobe_engine.images import open_reference, save_png
from omniprobe_engine.knobs import GROUP_OFFLOADS, INT8, OFFLOADS, setting
from omniprobe_engine.kv_host import is_pinned
from omniprobe_engine.pinned_weights import packed_pinning
from omniprobe_engine.protocol import CLEAN_TOLERANCE_MIB, POOL_LIMIT_ENV

QUANTISED_BY = {"text_encoder": "quantize_text_encoder", "transformer": "quantize_dit"}


class ProfileError(ValueError):
    """A profile or weights spec the engine cannot honour (raised before anything is built)."""


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


class DiffusersEngine:
    """The profile's pipeline under the profile; a failed request (an OOM) leaves it usable."""

    peak_source = "torch-reserved"  # max_memory_reserved over the request
    survives_failure = True  # unlike Omni.generate, a Diffusers pipeline is not closed by an OOM

    def __init__(self, model: str, kwargs: dict):
        import torch

        self.torch = torch
        profile, weights = kwargs["profile"], kwargs["weights"]
        self.profile = profile
        # The condition size, resolved by hosts.toml (the profile's, else its defaults'); none
        # given: the pipeline's own default.
        resolution = kwargs.get("output_resolution")
        self.sizing = {} if resolution is None else {"output_resolution": int(resolution)}
        offload = setting(profile, "offload")
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        refusal = profile_refusal(profile, self.device == "cuda")
        if refusal is not None:
            raise ProfileError(refusal)
        dtype = getattr(torch, setting(profile, "dtype"))
        quantised = {name for name, key in QUANTISED_BY.items() if setting(profile, key) == INT8}
        started = time.monotonic()
        import diffusers

        self.adapter = adapter_for(setting(profile, "pipeline"))
        pipeline = getattr(diffusers, setting(profile, "pipeline"))
        if weights["kind"] == "random":
            self.build_path = "random-streamed"
            self.pipe = self._built_random(pipeline, weights, dtype, quantised, offload)
        elif weights["kind"] == "snapshot":
            # from_pretrained's own load path: the whole pipeline, then quantised and placed.
            self.build_path = "from-pretrained"
            self.pipe = pipeline.from_pretrained(model, torch_dtype=dtype, local_files_only=True)
            for name in self._weighted():
                module = getattr(self.pipe, name)
                if name in quantised:
                    from torchao.quantization import Int8WeightOnlyConfig, quantize_

                    quantize_(module, Int8WeightOnlyConfig(),
                              device=None if self.device == "cpu" else self.device)
                    module.to("cpu")
                self._place_component(name, module)
        else:
            raise ProfileError(f"weights {weights['kind']!r}: expected 'random' or 'snapshot'")
        self.parameters_b = {name: parameters_b(getattr(self.pipe, name))
                             for name in self._weighted()}
        self._place_pipeline(offload)
        if setting(profile, "vae_tiling"):
            self.pipe.vae.enable_tiling()
        gc.collect()
        self.build_s = round(time.monotonic() - started, 3)
        self.build_peak_mib = self._peaks()[1]
        # What a clean request starts from: the placed build, before any request ran.
        self.resident_mib = held_mib(torch, self.device)[0]
        self.host = placed_host_figures(torch, [getattr(self.pipe, n) for n in self._weighted()])
        self.expandable_segments = expandable_segments_active(torch)
        self.kv = self.adapter.recorder(self.pipe, setting(profile, "kv_placement"))

    def _built_random(self, pipeline, weights: dict, dtype, quantised: set[str], offload: str):
        """The pipeline from its committed components: the weighted ones streamed in load order
        (diffusers_build.py), then those without weights from the adapter, and the scheduler by
        the adapter's class name with its defaults; all handed to the pipeline by keyword."""
        import diffusers

        components = weights["components"]
        parts = build_streamed(components, dtype, int(weights["seed"]), init_device=self.device,
                               quantised=quantised,
                               keep_on=self.device if offload == "none" else "cpu",
                               place=self._place_component)
        for name in sorted(set(components) - set(parts)):
            parts[name] = self.adapter.unweighted(name, components[name]["class"],
                                                  components[name]["config"])
        scheduler = getattr(diffusers, self.adapter.scheduler)()
        return pipeline(scheduler=scheduler, **parts)

    def _weighted(self) -> list[str]:
        """The pipeline's components with weights, in load order (sorted by name)."""
        return sorted(name for name, part in self.pipe.components.items()
                      if isinstance(part, self.torch.nn.Module))

    def _place_component(self, name: str, module) -> None:
        """Group offload: the component's hooks, applied as soon as it is complete (the
        profile's stream settings as apply_group_offloading takes them)."""
        offload = setting(self.profile, "offload")
        if offload not in GROUP_OFFLOADS:
            return
        from diffusers.hooks import apply_group_offloading

        torch = self.torch
        extra = ({} if offload == "group-leaf"
                 else {"num_blocks_per_group": 1})  # the knob table's group-block: one block
        with (packed_pinning(module) if setting(self.profile, "pinned_weights") == "packed"
              else nullcontext()):
            apply_group_offloading(
                module, onload_device=torch.device("cuda"), offload_device=torch.device("cpu"),
                offload_type="leaf_level" if offload == "group-leaf" else "block_level",
                use_stream=setting(self.profile, "use_stream"),
                record_stream=setting(self.profile, "record_stream"),
                low_cpu_mem_usage=setting(self.profile, "low_cpu_mem_usage"), **extra)

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
        if self.device == "cuda":
            # The pool the last request left cached would count in this one's reserved peak, and
            # the pinned blocks it left cached in its page-locked peak.
            torch.cuda.empty_cache()
            release_pinned_cache(torch)
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.reset_peak_host_memory_stats()
        start, start_reserved = held_mib(torch, self.device)
        pinned_start = pinned_mib(torch)
        images = [open_reference(path) for path in request["reference_paths"]]
        host = HostSampler()
        clock = StepClock(torch, self.device)
        try:
            with host:
                out = self.pipe(
                    prompt=request["prompt"], image=images or None, height=request["height"],
                    width=request["width"], num_inference_steps=request["num_inference_steps"],
                    generator=torch.Generator("cpu").manual_seed(request["seed"]),
                    output_type="pil",
                    **self._at_step_end(request["num_inference_steps"], clock),
                    **self.adapter.call_arguments(self.pipe, self.profile, request, self.sizing))
            clock.ended()
        finally:
            allocated, reserved = self._peaks()
            self.last = {"peak_mib": reserved, "peak_allocated_mib": allocated,
                         "start_allocated_mib": start, "start_reserved_mib": start_reserved,
                         **self.kv.take(),
                         "max_rss_mib": max_rss_mib(), "host_peak_mib": host.peak_mib,
                         "host_end_mib": host.end_mib,
                         "pinned_host_peak_mib": pinned_mib(torch, "allocated_bytes.peak"),
                         "pinned_host_start_mib": pinned_start,
                         **self._outside_pool(), **clock.figures()}
        save_png(out.images[0], request["output"])
        return self.last

    def _at_step_end(self, steps: int, clock: StepClock) -> dict:
        """The call's callback: each denoising step's end on the clock; with
        release_kv_before_decode, after the last step, the recorder counts the conditioning cache,
        then frees it before the decode."""
        release = setting(self.profile, "release_kv_before_decode")

        def at_step_end(pipe, step: int, timestep, tensors: dict) -> dict:
            clock.step_ended()
            if release and step == steps - 1:
                self.kv.release()
            return {}

        return {"callback_on_step_end": at_step_end}

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

    def recover(self) -> str | None:
        """After a failed request (called once its exception and traceback are gone), bring the
        pipeline back to its state after the build: first what the adapter knows its family's
        pipeline keeps per call (Qwen-Image-2.1's VAE feature cache), then the group-offload
        groups left on the device, the models CPU offload left there, garbage and the allocator's
        cache. Returns None when torch holds no more than after the build (within
        CLEAN_TOLERANCE_MIB), else why not: the runner must not go on with this pipeline."""
        self.adapter.recover(self.pipe)
        if setting(self.profile, "offload") in GROUP_OFFLOADS:
            for name in self._weighted():
                offload_groups(getattr(self.pipe, name))
        elif setting(self.profile, "offload") == "model-cpu":
            self.pipe.maybe_free_model_hooks()
        gc.collect()
        if self.device == "cuda":
            self.torch.cuda.empty_cache()
        return self.dirty()

    def dirty(self, allocated_mib: float | None = None) -> str | None:
        """Why the pipeline is not as the build left it (`allocated_mib`: what a request started
        with; else what torch holds now), or None: within CLEAN_TOLERANCE_MIB of the build's."""
        if allocated_mib is None:
            allocated_mib = held_mib(self.torch, self.device)[0]
        if allocated_mib is None or self.resident_mib is None:
            return None
        over = allocated_mib - self.resident_mib
        if over <= CLEAN_TOLERANCE_MIB:
            return None
        return (f"torch holds {allocated_mib:,.0f} MiB allocated, {over:,.0f} MiB over the "
                f"{self.resident_mib:,.0f} MiB the build left (tolerance {CLEAN_TOLERANCE_MIB} MiB)")


class StepClock:
    """Where a request's time goes, read at each denoising step's end (the GPU synchronized
    first, so a step's queued kernels count in it): to the first step's end (the prompt and the
    references encoded, and step 0, which writes the conditioning cache), each later step (reading
    it), and from the last step's end to the image (the decode). The measuring GPU's seconds."""

    def __init__(self, torch, device: str):
        self.torch, self.device = torch, device
        self.started = time.perf_counter()
        self.step_ends: list[float] = []
        self.end: float | None = None

    def _now(self) -> float:
        if self.device == "cuda":
            self.torch.cuda.synchronize()
        return time.perf_counter() - self.started

    def step_ended(self) -> None:
        self.step_ends.append(self._now())

    def ended(self) -> None:
        self.end = self._now()

    def figures(self) -> dict:
        """The figures this request reached (none of a step it never finished)."""
        ends = self.step_ends
        found = {}
        if ends:
            found["first_step_end_s"] = round(ends[0], 3)
        if len(ends) > 1:
            found["step_after_first_s"] = round((ends[-1] - ends[0]) / (len(ends) - 1), 4)
        if ends and self.end is not None:
            found["decode_s"] = round(self.end - ends[-1], 3)
        return found


def held_mib(torch, device: str) -> tuple[float | None, float | None]:
    """What torch holds on the device now: allocated and reserved MiB (None, None without CUDA).
    Looked up as a module global at each call, so a test double of the pipeline can stand in for
    the device on the CPU, as it reads the pool limit from POOL_LIMIT_ENV."""
    if device != "cuda":
        return None, None
    return (round(torch.cuda.memory_allocated() / MIB, 1),
            round(torch.cuda.memory_reserved() / MIB, 1))


def offload_groups(module) -> None:
    """Offload every group-offload group of `module` a failed request left on the device.
    diffusers 0.42.1 has no public call for it: each hooked module's group_offloading hook holds
    its group, whose offload_() moves it back (internal API; a module without the hook, or a
    diffusers without it, is left as it is)."""
    for part in module.modules():
        registry = getattr(part, "_diffusers_hook", None)
        hook = registry.get_hook("group_offloading") if registry is not None else None
        group = getattr(hook, "group", None)
        if group is not None and hasattr(group, "offload_"):
            group.offload_()


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


def profile_refusal(profile: dict, cuda: bool, components: dict | None = None) -> str | None:
    """Why the engine cannot build `profile` on this machine, in the words it refuses it with
    (the harness asks before any runner starts, through `--versions PROFILES`); None: it can.
    `components`: a random build's, whose classes say what the pipeline will be built of."""
    try:
        adapter = adapter_for(setting(profile, "pipeline"))
    except KeyError as exc:
        return str(exc.args[0])
    offload = setting(profile, "offload")
    if offload not in OFFLOADS:
        return f"offload {offload!r}: expected one of {', '.join(OFFLOADS)}"
    if not cuda and offload != "none":
        return f"offload {offload!r} needs a CUDA device; this machine has none"
    placement = setting(profile, "kv_placement")
    if not cuda and is_pinned(placement):
        return (f"kv_placement {placement!r} needs a CUDA device to pin memory; this machine "
                "has none")
    vae = (components or {}).get("vae", {}).get("class", "")
    if setting(profile, "vae_tiling") and vae:
        try:
            tiles = hasattr(resolve_class(vae), "enable_tiling")
        except ValueError as exc:
            return f"vae_tiling = true: {exc}"
        if not tiles:
            return f"vae_tiling = true: the VAE class {vae} has no enable_tiling"
    return adapter.refusal(profile)


def asked_facts(profiles: dict[str, dict], components: dict | None) -> dict:
    """What the engine would do, asked before anything is built: each profile it would refuse
    here, with its words (torch is imported for it), and, for a random build's components, each
    weighted component's parameters, counted on the meta device."""
    import torch

    cuda = torch.cuda.is_available()
    found = {name: profile_refusal(p, cuda, components) for name, p in profiles.items()}
    facts: dict = {"refusals": {name: why for name, why in found.items() if why is not None}}
    if components:
        facts["parameters"] = parameter_counts(components)
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
