"""Group offload's page-locked weight copies carved out of slabs: `pinned_weights = "packed"`.

With streams, and low_cpu_mem_usage off, apply_group_offloading keeps a page-locked copy of every
offloaded tensor, each pinned as a block of its own (diffusers 0.42.1, ModuleGroup._to_cpu:
`.pin_memory()`), and torch's pinned allocator rounds each block up to a power of two: leaf
offload pinned 39.1 GiB for Qwen-Image-2.1's 30.2 GiB of weights, and 21.9 GiB for FLUX.2
[klein] 4B's 14.9 (committed build figures). While apply_group_offloading runs on a component,
`packed_pinning` makes each copy a carve of slabs sized to the component's bytes
(pinned_slabs.Slabs, none over MAX_SLAB_BYTES) instead. A torchao tensor's inner tensors are
carved each, as its own pin_memory pins each.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from omniprobe_engine.pinned_slabs import Slabs, aligned

# apply_group_offloading frees a group's pageable weights once its copies are made, group by
# group: a slab is page-locked before the weights it will hold are freed, so the build holds up
# to one slab beyond the weights. A power of two, so torch's rounding adds nothing to it.
MAX_SLAB_BYTES = 1 << 30


def plain_tensors(tensor) -> list:
    """The plain tensors that hold `tensor`'s values: a torchao quantised tensor's are its inner
    tensors (each its own storage), a plain tensor's itself."""
    if hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        return [t for name in names for t in plain_tensors(getattr(tensor, name))]
    return [tensor]


def carved_bytes(module) -> int:
    """What `module`'s parameters and buffers take carved (each plain tensor aligned)."""
    return sum(aligned(t.numel() * t.element_size())
               for tensor in [*module.parameters(), *module.buffers()]
               for t in plain_tensors(tensor))


def carved(tensor, slabs: Slabs):
    """A copy of the host tensor `tensor` in memory carved out of `slabs`."""
    if hasattr(tensor, "__tensor_flatten__"):
        return tensor._apply_fn_to_data(lambda inner: carved(inner, slabs))
    return slabs.empty_like(tensor).copy_(tensor)


@contextmanager
def packed_pinning(module, *, pinned: bool = True) -> Iterator[Slabs]:
    """While apply_group_offloading runs on `module`: every page-locked copy its groups keep is
    carved out of one Slabs sized to the module's tensors (yielded, for its bytes). What
    low_cpu_mem_usage pins on the fly is left as diffusers does it. `pinned`: False only where a
    test has no CUDA to pin with."""
    from diffusers.hooks.group_offloading import ModuleGroup

    original = ModuleGroup.__dict__["_to_cpu"]
    slabs = Slabs(pinned=pinned, expected_bytes=carved_bytes(module),
                  max_slab_bytes=MAX_SLAB_BYTES)

    def to_cpu(tensor, low_cpu_mem_usage):
        if low_cpu_mem_usage:
            return original.__func__(tensor, low_cpu_mem_usage)
        # As _to_cpu reads it: a torchao tensor whole (its .data lacks the inner tensors).
        return carved((tensor if hasattr(tensor, "__tensor_flatten__") else tensor.data).cpu(),
                      slabs)

    ModuleGroup._to_cpu = staticmethod(to_cpu)
    try:
        yield slabs
    finally:
        ModuleGroup._to_cpu = original
