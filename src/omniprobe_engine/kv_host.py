"""The conditioning KV cache in host memory: what the seed found no spill path for upstream.

A pipeline's per-layer cache object is written once (`store(k, v)`, at the first denoising step)
and read at every later step (`get()`). A layer cache placed in host memory keeps host copies of
K and V, pinned (page-locked: fast to copy back, never swapped) or pageable, and hands each use a
temporary copy on the compute device, so only the layer being computed holds its K and V there.

One pinned block per layer's K and per its V held 16 GiB for an 8.1 GiB cache (4 references, on
the H100): torch rounds each up to a power of two. Packed, the layers' K and V are carved out of a
few slabs sized to the cache as it comes (pinned_slabs.Slabs).
"""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe_engine.pinned_slabs import Slabs


@dataclass(frozen=True)
class HostMemory:
    pinned: bool
    packed: bool = False  # carved out of shared slabs, not one block per tensor


HOST_PLACEMENTS = {"host-pinned": HostMemory(pinned=True),
                   "host-pinned-packed": HostMemory(pinned=True, packed=True),
                   "host-pageable": HostMemory(pinned=False)}


def is_pinned(placement: str) -> bool:
    """Whether `placement` keeps the cache in page-locked host memory."""
    memory = HOST_PLACEMENTS.get(placement)
    return memory is not None and memory.pinned


def cache_slabs(memory: HostMemory, num_layers: int) -> Slabs | None:
    """One cache's slabs where its placement packs (every layer's K and V carved out of them),
    else None: each tensor a block of its own."""
    return Slabs(pinned=memory.pinned, expected_tensors=2 * num_layers) if memory.packed else None


def layer_figures(layers: list, names: tuple[str, str] = ("k", "v")) -> dict:
    """What a cache's layer caches hold (their K and V under `names`): the bytes of the layers
    filled, of them in host memory, and those layers of how many; a request that failed during
    the first step filled only some."""
    key, value = names
    filled = [(getattr(layer, key), getattr(layer, value), getattr(layer, "host_placed", False))
              for layer in layers]
    filled = [(k, v, host) for k, v, host in filled if k is not None and v is not None]
    if not filled:
        return {"kv_cache_layers": 0, "kv_cache_layers_total": len(layers)}
    held = [(sum(t.numel() * t.element_size() for t in (k, v)), host) for k, v, host in filled]
    return {"kv_cache_bytes": sum(b for b, _ in held),
            "kv_cache_host_bytes": sum(b for b, host in held if host),
            "kv_cache_layers": len(filled), "kv_cache_layers_total": len(layers)}


def host_placed(layer_base: type, *, pinned: bool, compute_device=None,
                names: tuple[str, str] = ("k", "v")) -> type:
    """A subclass of the pipeline's layer cache `layer_base` that keeps K and V (its attributes
    `names`) in host memory. `compute_device`: where `get` hands them (None: where `store` got
    them). Made with a `Slabs`, a layer carves its K and V out of it; without, each is a block of
    its own."""
    key, value = names

    class HostPlaced(layer_base):
        host_placed = True

        def __init__(self, slabs: Slabs | None = None):
            super().__init__()
            self.slabs = slabs

        def store(self, k, v):
            self.device = compute_device if compute_device is not None else k.device
            setattr(self, key, self._to_host(k))
            setattr(self, value, self._to_host(v))

        def get(self):
            k, v = getattr(self, key), getattr(self, value)
            if k is None:
                raise RuntimeError("KV cache has not been populated yet.")
            return k.to(self.device, non_blocking=pinned), v.to(self.device, non_blocking=pinned)

        def _to_host(self, tensor):
            # One copy, from the device straight into the host buffer: `.to("cpu").pin_memory()`
            # staged each layer in pageable memory first and copied it twice.
            host = (self.slabs.empty_like(tensor) if self.slabs is not None
                    else tensor.new_empty(tensor.shape, device="cpu", pin_memory=pinned))
            return host.copy_(tensor.detach())

    return HostPlaced
