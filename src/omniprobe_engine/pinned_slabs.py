"""Host memory carved out of a few power-of-two slabs instead of a block per tensor.

torch's pinned host allocator rounds every block up to a power of two, so pinning tensors one
block each holds up to twice their bytes: 16 GiB for the 8.1 GiB conditioning cache at 4
references, 39.1 GiB for Qwen-Image-2.1's 30.2 GiB of weights under group offload with streams
(both on the H100, committed evidence). Carved in order out of slabs that are themselves powers of
two, the rounding adds at most part of one tensor a slab. The conditioning cache in host memory
(kv_host.py) and group offload's weight copies (pinned_weights.py) both carve here. torch is
imported where a slab is made, not at import: the configuration reads the slab rule.
"""

from __future__ import annotations

ALIGN_BYTES = 512  # each carved tensor starts on it: any dtype's element, and DMA-friendly


def power_of_two_ceil(size: int) -> int:
    """What torch's pinned host allocator makes of a block of `size` bytes."""
    return 1 << max(size - 1, 0).bit_length()


def aligned(size: int) -> int:
    return -(-size // ALIGN_BYTES) * ALIGN_BYTES


def slab_bytes(tensor_bytes: int, rest_bytes: int) -> int:
    """The next slab, when a tensor of `tensor_bytes` (aligned) is to be carved and `rest_bytes`
    are still to come, it among them: the smallest power of two that holds them all where it
    wastes less than that tensor, else the largest power of two they fill (never less than the
    tensor's own block). Each slab then wastes less than a tensor, and the slabs halve as the
    bytes run out."""
    rest = max(rest_bytes, tensor_bytes)
    whole = power_of_two_ceil(rest)
    if whole - rest < tensor_bytes:
        return whole
    return max(1 << (rest.bit_length() - 1), power_of_two_ceil(tensor_bytes))


def packed_bytes(tensor_bytes: int, tensors: int) -> int:
    """The slabs' bytes for `tensors` tensors of `tensor_bytes` each, carved as `Slabs` carves."""
    size, total = aligned(tensor_bytes), 0
    while tensors > 0:
        slab = slab_bytes(size, size * tensors)
        tensors -= min(tensors, slab // size)
        total += slab
    return total


class Slabs:
    """Tensors' host memory carved out of slabs of `slab_bytes`, pinned or not: each in the first
    slab with room for it, else in a new one sized to the bytes still expected. What is expected
    is given as bytes (`expected_bytes`: a component's weights, known before the first) or as a
    count of tensors all of one size (`expected_tensors`: a cache's K and V, sized by the first);
    a tensor past it gets a slab of its own. `max_slab_bytes`: no slab larger, but for a tensor
    larger itself (its own block's size)."""

    def __init__(self, *, pinned: bool, expected_bytes: int | None = None,
                 expected_tensors: int | None = None, max_slab_bytes: int | None = None):
        if (expected_bytes is None) == (expected_tensors is None):
            raise ValueError("Slabs: give expected_bytes or expected_tensors, one of them")
        self.pinned, self.expected_bytes, self.expected_tensors = (pinned, expected_bytes,
                                                                   expected_tensors)
        self.max_slab_bytes = max_slab_bytes
        self.stored_bytes = 0
        self.slabs: list = []  # the host buffers, uint8
        self.free_from: list[int] = []  # per slab, its first free byte

    def empty_like(self, tensor):
        """A host tensor shaped and typed as `tensor` (contiguous), carved from a slab."""
        import torch

        raw = tensor.numel() * tensor.element_size()
        if raw == 0:  # nothing to carve (and no power of two below one byte)
            return torch.empty(tensor.shape, dtype=tensor.dtype)
        size = aligned(raw)
        index = next((i for i, slab in enumerate(self.slabs)
                      if slab.numel() - self.free_from[i] >= size), None)
        if index is None:
            if self.expected_bytes is None:
                self.expected_bytes = self.expected_tensors * size
            slab = slab_bytes(size, self.expected_bytes - self.stored_bytes)
            if self.max_slab_bytes is not None:
                slab = min(slab, max(self.max_slab_bytes, power_of_two_ceil(size)))
            self.slabs.append(torch.empty(slab, dtype=torch.uint8, pin_memory=self.pinned))
            self.free_from.append(0)
            index = len(self.slabs) - 1
        start = self.free_from[index]
        self.free_from[index] += size
        self.stored_bytes += size
        return self.slabs[index][start:start + raw].view(tensor.dtype).view(tensor.shape)

    @property
    def nbytes(self) -> int:
        return sum(s.numel() for s in self.slabs)
