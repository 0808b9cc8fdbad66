"""The conditioning cache's host placements on their own, without a model (target: packed pins
at most 1.1 × the cache's bytes; one block per tensor pinned 2.0 × on the H100 at 4 references).

A stand-in cache of `--layers` layers, each storing K and V of `--tensor-mib` MiB from the GPU
(default: the H100's 4-reference cache, 8,740,405,248 bytes over 32 layers), through each host
placement of omniprobe_engine/kv_host.py. Per placement: the page-locked bytes torch's pinned
allocator took (host_memory_stats, its cached blocks given back first), the time to store every
layer (the first denoising step's extra), and to hand every layer back to the GPU once (each
later step's extra). Needs CUDA; seconds of GPU time.

    PYTHONPATH=src python benchmarks/kv_host_placement.py [--layers 32] [--tensor-mib 130.2]
"""

from __future__ import annotations

import argparse
import sys
import time

from omniprobe_engine.diffusers_build import pinned_mib, release_pinned_cache
from omniprobe_engine.kv_host import HOST_PLACEMENTS, cache_slabs, host_placed

TARGET_PACKED = 1.1
H100_CACHE_BYTES = 8_740_405_248  # 4 references, 32 layers, K and V each


class StandInLayer:
    """What kv_host subclasses: a layer cache with k and v."""

    def __init__(self):
        self.k = self.v = None


def one_placement(torch, placement: str, layers: int, tensor_bytes: int) -> dict:
    memory = HOST_PLACEMENTS[placement]
    release_pinned_cache(torch)  # the blocks of the placement before it go back, as per request
    before = pinned_mib(torch)
    slabs = cache_slabs(memory, layers)
    cls = host_placed(StandInLayer, pinned=memory.pinned)
    caches = [cls(slabs) for _ in range(layers)]
    source = torch.empty(tensor_bytes // 2, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for cache in caches:
        cache.store(source, source)
    torch.cuda.synchronize()
    store_s = time.perf_counter() - start
    start = time.perf_counter()
    for cache in caches:
        k, v = cache.get()
        del k, v
    torch.cuda.synchronize()
    get_s = time.perf_counter() - start
    took_mib = pinned_mib(torch) - before
    del caches, slabs
    return {"placement": placement, "pinned_gib": took_mib / 1024, "store_s": store_s,
            "get_s": get_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--tensor-mib", type=float,
                        default=H100_CACHE_BYTES / 64 / 2**20)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("needs CUDA: pinned host memory and the copies it speeds are a GPU's",
              file=sys.stderr)
        return 2
    tensor_bytes = int(args.tensor_mib * 2**20) // 2 * 2
    cache_gib = 2 * args.layers * tensor_bytes / 2**30
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; a cache of "
          f"{args.layers} layers x K and V of {tensor_bytes / 2**20:.1f} MiB = {cache_gib:.2f} GiB")
    print(f"{'placement':<20} {'pinned GiB':>10} {'x cache':>8} {'store s':>8} {'get s':>8}")
    rows = [one_placement(torch, p, args.layers, tensor_bytes) for p in HOST_PLACEMENTS]
    for r in rows:
        print(f"{r['placement']:<20} {r['pinned_gib']:>10.2f} {r['pinned_gib'] / cache_gib:>8.2f} "
              f"{r['store_s']:>8.3f} {r['get_s']:>8.3f}")
    packed = next(r for r in rows if HOST_PLACEMENTS[r["placement"]].packed)
    ratio = packed["pinned_gib"] / cache_gib
    print(f"target: packed pins at most {TARGET_PACKED} x the cache: {ratio:.2f} "
          + ("met" if ratio <= TARGET_PACKED else "MISSED"))
    return 0 if ratio <= TARGET_PACKED else 1


if __name__ == "__main__":
    sys.exit(main())
