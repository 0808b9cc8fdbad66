"""The conditioning KV cache in host memory: what the seed found no spill path for upstream.

A pipeline's per-layer cache object is written once (`store(k, v)`, at the first denoising step)
and read at every later step (`get()`). A layer cache placed in host memory keeps host copies of
K and V, pinned (page-locked: fast to copy back, never swapped) or pageable, and hands each use a
temporary copy on the compute device, so only the layer being computed holds its K and V there.
torch is imported by the caller's class, not here: the standard library only at import time.
"""

from __future__ import annotations

HOST_PLACEMENTS = {"host-pinned": True, "host-pageable": False}  # placement -> pinned


def host_placed(layer_base: type, *, pinned: bool, compute_device=None) -> type:
    """A subclass of the pipeline's layer cache `layer_base` that keeps K and V in host memory.
    `compute_device`: where `get` hands them (None: where `store` got them)."""

    class HostPlaced(layer_base):
        host_placed = True

        def store(self, k, v):
            self.device = compute_device if compute_device is not None else k.device
            self.k, self.v = _to_host(k, pinned), _to_host(v, pinned)

        def get(self):
            if self.k is None:
                raise RuntimeError("KV cache has not been populated yet.")
            return (self.k.to(self.device, non_blocking=pinned),
                    self.v.to(self.device, non_blocking=pinned))

    return HostPlaced


def _to_host(tensor, pinned: bool):
    # One copy, from the device straight into the host buffer: `.to("cpu").pin_memory()` staged
    # each layer in pageable memory first and copied it twice.
    host = tensor.new_empty(tensor.shape, device="cpu", pin_memory=pinned)
    return host.copy_(tensor.detach())
