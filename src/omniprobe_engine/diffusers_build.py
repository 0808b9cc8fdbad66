"""The Diffusers engine's streamed random build and its host-memory figures (diffusers_engine.py
imports it; like it, it imports the standard library, torch, accelerate,
transformers, diffusers and torchao only, never omniprobe).

The build streams as a checkpoint's load does: the components one at a time in the order
`from_pretrained` loads them (sorted by name), each made from its committed class and config on
the meta device, then filled unit by unit (a module's
own tensors) from a pool of values drawn on the init device from one recorded seed; a unit the
profile quantises is quantised as soon as it is filled, a unit kept on the GPU moves there, and
each component is placed (offloaded, moved) before the next is made. So no point of the build
holds more than the finished placement plus one unit in the build dtype, beside the component's
pool of random values (POOL_ELEMENTS at most, less than one block of the full model). Its host
figures are
the random build's: a real `from_pretrained` reads the checkpoint shard by shard, not unit by unit,
and a real host's measurement replaces them.
"""

from __future__ import annotations

import gc
import os
import resource
from typing import Any

from omniprobe_engine.pinned_weights import plain_tensors

MIB = 1024**2
POOL_ELEMENTS = 1 << 26  # random values drawn per component: 128 MiB in bf16, under one block
RSS_SAMPLE_S = 0.02  # the request-time host sampler's period: a request runs for seconds
_INIT_STD = 0.02  # any finite spread does: the values never matter, only the shapes


def value_pool(numel: int, dtype, init_device: str, seed: int,
               pool_elements: int = POOL_ELEMENTS):
    """One pool of random values drawn on `init_device` from `seed`, copied to the host once;
    tensors take its values from a running offset (wrapping), so the build holds at most the
    pool on the GPU and costs little more than the memory it fills."""
    import torch

    generator = torch.Generator(device=init_device).manual_seed(seed)
    pool = torch.empty(max(1, min(pool_elements, numel)), dtype=dtype, device=init_device)
    pool.normal_(0.0, _INIT_STD, generator=generator)
    return pool.to("cpu")


def _fill_from(flat, pool, offset: int) -> int:
    """Copy the pool into `flat` from `offset` on, wrapping; the offset after it."""
    done, size = 0, pool.numel()
    while done < flat.numel():
        take = min(flat.numel() - done, size - offset)
        flat[done:done + take].copy_(pool[offset:offset + take])
        done += take
        offset = (offset + take) % size
    return offset


def parameters_b(module) -> float:
    return round(sum(p.numel() for p in module.parameters()) / 1e9, 4)


def tensor_bytes(tensor) -> int:
    """Bytes a tensor holds: a torchao quantised tensor's are its inner tensors'."""
    return sum(t.numel() * t.element_size() for t in plain_tensors(tensor))


class BuildObserver:
    """What a streamed build tells of itself (a test records the live bytes through it)."""

    def pooled(self, component: str, pool) -> None:
        """`component`'s pool of random values is drawn, held until the component is filled."""

    def filled(self, component: str, module, name: str, unit) -> None:
        """`unit` (`name` in `module`) holds its values in the build dtype, not yet quantised or
        placed."""

    def placed(self, component: str, module) -> None:
        """`component` is complete and placed; the next is not made yet."""


def resolve_class(class_name: str):
    """A component's class from its committed name, "diffusers.X" or "transformers.X" (anything
    after the first space is a note), as diffusers' from_pretrained resolves model_index.json's
    (library, class) pairs; ValueError naming what it cannot find."""
    import importlib

    library, _, name = class_name.split(" ")[0].partition(".")
    if library not in ("diffusers", "transformers") or not name:
        raise ValueError(f"class {class_name!r}: expected 'diffusers.<Class>' or "
                         "'transformers.<Class>'")
    found = getattr(importlib.import_module(library), name, None)
    if found is None:
        raise ValueError(f"class {class_name!r}: the installed {library} has no {name}")
    if not isinstance(found, type):
        raise ValueError(f"class {class_name!r}: {library}.{name} is no class (a module or a "
                         "function)")
    if name.endswith("Pipeline"):
        raise ValueError(f"class {class_name!r}: a pipeline class, not a component's")
    return found


def weighted_components(components: dict) -> dict:
    """The components with weights (torch modules) of a {name: {"class", "config"}} map, by name
    in sorted order: from_pretrained loads model_index.json's components in its key order, which
    save_pretrained writes sorted. The rest (a tokenizer, a processor) the adapter makes."""
    import torch

    return {name: components[name] for name in sorted(components)
            if issubclass(resolve_class(components[name]["class"]), torch.nn.Module)}


def _made(class_name: str, config: dict):
    """One component from its config: a transformers model from its config class, a diffusers
    model from its keyword arguments (as from_config passes them)."""
    cls = resolve_class(class_name)
    config_class = getattr(cls, "config_class", None)
    return cls(config_class(**config)) if config_class is not None else cls(**config)


def empty_components(components: dict) -> dict:
    """The pipeline's weighted components on the meta device, by name, in load order; a
    transformers model's tied weights tied, as from_pretrained ties them. Made under
    init_empty_weights, whose register_parameter gives each assignment a new meta tensor,
    Qwen3ForCausalLM's lm_head is a second copy of its embedding until tie_weights() runs
    outside it (transformers 5.17)."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        made = {name: _made(spec["class"], spec["config"])
                for name, spec in weighted_components(components).items()}
    for module in made.values():
        tie = getattr(module, "tie_weights", None)  # transformers' models have it
        if tie is not None:
            tie()
    return made


def parameter_counts(components: dict) -> dict[str, int]:
    """Each weighted component's parameters, counted on the meta device (nothing is allocated):
    what a random build would fill, asked before it starts."""
    return {name: sum(p.numel() for p in module.parameters())
            for name, module in empty_components(components).items()}


def fill_streamed(name: str, module, dtype, seed: int, *, init_device: str, quantise: bool,
                  keep_on: str, observer: BuildObserver) -> None:
    """Fill `module`'s meta tensors unit by unit; each unit, once filled, is quantised (int8
    weight-only, its linear layer) when `quantise`, and moved to `keep_on` (the GPU for a
    component kept there, else the host). Shared parameters are made once."""
    import torch

    pending = sum(p.numel() for p in module.parameters() if p.device.type == "meta")
    pool, offset = value_pool(pending, dtype, init_device, seed), 0
    observer.pooled(name, pool)
    made: dict[int, Any] = {}
    modules = dict(module.named_modules())
    with torch.no_grad():
        for unit_name, unit in modules.items():
            params = [(k, p) for k, p in unit._parameters.items() if p is not None]
            origin = {key: id(param) for key, param in params}
            fresh = False
            for key, param in params:
                if id(param) in made:
                    unit._parameters[key] = made[id(param)]
                    continue
                if param.device.type == "meta":
                    value = torch.empty(param.shape, dtype=dtype)
                    offset = _fill_from(value.view(-1), pool, offset)
                    fresh = True
                else:
                    value = param.data.to(dtype=dtype, device="cpu")
                made[id(param)] = unit._parameters[key] = torch.nn.Parameter(
                    value, requires_grad=False)
            if not fresh:
                continue
            observer.filled(name, module, unit_name, unit)
            if quantise and isinstance(unit, torch.nn.Linear):
                _quantise_unit(unit, init_device)
            _move_own(unit, keep_on)
            for key, was in origin.items():  # a module sharing it takes its final form
                made[was] = unit._parameters[key]
    if keep_on != "cpu":
        module.to(keep_on)  # the buffers of modules without weights
    module.eval()


def _quantise_unit(unit, init_device: str) -> None:
    """torchao's int8 weight-only quantize_ of one linear layer, on the init device. It is given
    the layer alone: quantize_ moves the module it is given to `device`, and a parent still holds
    unmade (meta) siblings. The device is passed on the CPU too, so the CPU tests take that path."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(unit, Int8WeightOnlyConfig(), device=init_device)


def _move_own(unit, device: str) -> None:
    """Move a unit's own parameters and buffers (not its children's, which may be unmade); a
    quantised weight moves as its tensor subclass does."""
    import torch

    for key, param in unit._parameters.items():
        if param is not None and param.device.type != device:
            unit._parameters[key] = torch.nn.Parameter(param.detach().to(device),
                                                       requires_grad=False)
    for key, buffer in unit._buffers.items():
        if buffer is not None:
            unit._buffers[key] = buffer.to(device)


def build_streamed(components: dict, dtype, seed: int, *, init_device: str, quantised: set[str],
                   keep_on: str, place, observer: BuildObserver | None = None) -> dict:
    """The pipeline's weighted components of `components` ({name: {"class", "config"}}), in load
    order, each filled (`fill_streamed`) and then placed by `place(name, module)` before the next
    is made; one seed, one stream per component in that order, so the build is reproducible."""
    import torch

    observer = observer or BuildObserver()
    built = empty_components(components)
    for offset, (name, module) in enumerate(built.items()):
        fill_streamed(name, module, dtype, seed + offset, init_device=init_device,
                      quantise=name in quantised, keep_on=keep_on, observer=observer)
        place(name, module)
        gc.collect()
        observer.placed(name, module)
    if init_device != "cpu":
        torch.cuda.synchronize()
    return built


def rss_mib() -> float | None:
    """The process's resident memory now (Linux's /proc/self/statm); None where unreadable."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            pages = int(handle.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / MIB, 1)


def pinned_mib(torch, stat: str = "allocated_bytes.current") -> float | None:
    """Page-locked host memory torch's pinned allocator holds (its blocks rounded up to powers of
    two, active and cached); None without CUDA, where nothing can be pinned."""
    if not torch.cuda.is_available():
        return None
    return round(torch.cuda.host_memory_stats().get(stat, 0) / MIB, 1)


def release_pinned_cache(torch) -> None:
    """Give back the page-locked blocks torch's pinned allocator keeps cached once freed (an
    earlier request's host-placed KV cache): kept, they count in every later request's figure,
    so a runner that served smaller counts first would hold more at a larger one than it needs.
    The GPU is synchronized first, so no copy still reads a block."""
    torch.cuda.synchronize()
    torch._C._host_emptyCache()


def placed_host_figures(torch, modules) -> dict:
    """The host once the pipeline is placed: the build's peak (ru_maxrss: nothing ran before
    it), the resident memory now, of it page-locked and pageable, and the weight bytes the
    components' own tensors hold on the host."""
    steady, pinned = rss_mib(), pinned_mib(torch)
    seen: dict[int, int] = {}
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.device.type == "cpu":
                seen.setdefault(id(tensor), tensor_bytes(tensor))
    pageable = None if steady is None or pinned is None else round(max(0.0, steady - pinned), 1)
    # The kernel's high-water mark is updated lazily: the peak is at least what is held now.
    return {"build_host_peak_mib": max(max_rss_mib(), steady or 0.0), "steady_host_mib": steady,
            "pinned_host_mib": pinned, "pageable_host_mib": pageable,
            "host_weights_mib": round(sum(seen.values()) / MIB, 1)}


class HostSampler:
    """The process's resident memory, sampled on a thread while a request runs: ru_maxrss and a
    cgroup's memory.peak are lifetime peaks, which the build's own peak may hide. `end_mib` is
    the last reading, taken as the request ends."""

    def __init__(self, period_s: float = RSS_SAMPLE_S):
        import threading

        self.period_s, self.peak_mib, self.end_mib = period_s, None, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-rss", daemon=True)

    def _sample(self) -> float | None:
        now = rss_mib()
        self.peak_mib = now if self.peak_mib is None or (now or 0) > self.peak_mib else self.peak_mib
        return now

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def __enter__(self) -> HostSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.end_mib = self._sample()


def max_rss_mib() -> float:
    """The process's peak resident set so far (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


