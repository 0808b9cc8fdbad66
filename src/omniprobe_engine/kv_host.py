"""The conditioning KV cache in host memory: what the seed found no spill path for upstream.

A pipeline's per-layer cache object is written once (`store(k, v)`, at the first denoising step)
and read at every later step (`get()`). A layer cache placed in host memory keeps host copies of
K and V, pinned (page-locked: fast to copy back, never swapped) or pageable, and hands each use a
temporary copy on the compute device, so only the layer being computed holds its K and V there.

torch's pinned host allocator rounds every block up to a power of two, so one pinned block per
layer's K and per its V held 16 GiB for an 8.1 GiB cache (4 references, on the H100). Packed,
the layers' K and V are carved out of a few slabs sized to the cache as it comes (`Slabs`).
torch is imported where a tensor is made, not at import: the configuration reads the slab rule.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostMemory:
    pinned: bool
    packed: bool = False  # carved out of shared slabs, not one block per tensor


HOST_PLACEMENTS = {"host-pinned": HostMemory(pinned=True),
                   "host-pinned-packed": HostMemory(pinned=True, packed=True),
                   "host-pageable": HostMemory(pinned=False)}
ALIGN_BYTES = 512  # each carved tensor starts on it: any dtype's element, and DMA-friendly


def is_pinned(placement: str) -> bool:
    """Whether `placement` keeps the cache in page-locked host memory."""
    memory = HOST_PLACEMENTS.get(placement)
    return memory is not None and memory.pinned


def power_of_two_ceil(size: int) -> int:
    """What torch's pinned host allocator makes of a block of `size` bytes."""
    return 1 << max(size - 1, 0).bit_length()


def aligned(size: int) -> int:
    return -(-size // ALIGN_BYTES) * ALIGN_BYTES


def slab_bytes(tensor_bytes: int, tensors_to_come: int) -> int:
    """The next slab, when `tensors_to_come` tensors of `tensor_bytes` (aligned) are still to
    store: the smallest power of two that holds them all where it wastes less than one of them,
    else the largest power of two they fill (never less than one tensor's block). Each slab then
    wastes less than one tensor, and the slabs halve as the cache ends."""
    rest = tensor_bytes * max(tensors_to_come, 1)
    whole = power_of_two_ceil(rest)
    if whole - rest < tensor_bytes:
        return whole
    return max(1 << (rest.bit_length() - 1), power_of_two_ceil(tensor_bytes))


def packed_bytes(tensor_bytes: int, tensors: int) -> int:
    """The slabs' bytes for `tensors` tensors of `tensor_bytes` each, carved as `Slabs` carves."""
    size, total = aligned(tensor_bytes), 0
    while tensors > 0:
        slab = slab_bytes(size, tensors)
        tensors -= min(tensors, slab // size)
        total += slab
    return total


class Slabs:
    """One cache's host memory: the tensors it stores, carved in order out of slabs of
    `slab_bytes`, pinned or not. `expected`: how many tensors the cache stores (every layer's K
    and V); a tensor past it gets a slab of its own."""

    def __init__(self, expected: int, *, pinned: bool):
        self.expected, self.pinned = expected, pinned
        self.stored = 0
        self.slabs: list = []  # the host buffers, uint8
        self.free_from = 0  # the first free byte of the newest slab

    def empty_like(self, tensor):
        """A host tensor shaped and typed as `tensor`, carved from a slab."""
        import torch

        size = aligned(tensor.numel() * tensor.element_size())
        if not self.slabs or self.slabs[-1].numel() - self.free_from < size:
            slab = slab_bytes(size, self.expected - self.stored)
            self.slabs.append(torch.empty(slab, dtype=torch.uint8, pin_memory=self.pinned))
            self.free_from = 0
        start, self.free_from = self.free_from, self.free_from + size
        self.stored += 1
        carved = self.slabs[-1][start:start + tensor.numel() * tensor.element_size()]
        return carved.view(tensor.dtype).view(tensor.shape)

    @property
    def nbytes(self) -> int:
        return sum(s.numel() for s in self.slabs)


def host_placed(layer_base: type, *, pinned: bool, compute_device=None) -> type:
    """A subclass of the pipeline's layer cache `layer_base` that keeps K and V in host memory.
    `compute_device`: where `get` hands them (None: where `store` got them). Made with a `Slabs`,
    a layer carves its K and V out of it; without, each is a block of its own."""

    class HostPlaced(layer_base):
        host_placed = True

        def __init__(self, slabs: Slabs | None = None):
            super().__init__()
            self.slabs = slabs

        def store(self, k, v):
            self.device = compute_device if compute_device is not None else k.device
            self.k, self.v = self._to_host(k), self._to_host(v)

        def get(self):
            if self.k is None:
                raise RuntimeError("KV cache has not been populated yet.")
            return (self.k.to(self.device, non_blocking=pinned),
                    self.v.to(self.device, non_blocking=pinned))

        def _to_host(self, tensor):
            # One copy, from the device straight into the host buffer: `.to("cpu").pin_memory()`
            # staged each layer in pageable memory first and copied it twice.
            host = (self.slabs.empty_like(tensor) if self.slabs is not None
                    else tensor.new_empty(tensor.shape, device="cpu", pin_memory=pinned))
            return host.copy_(tensor.detach())

    return HostPlaced
