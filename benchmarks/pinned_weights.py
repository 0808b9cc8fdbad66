"""Group offload's page-locked weight copies as blocks and packed, at a model's real tensor sizes,
without building the model (target: packed pins at most 1.1 × the weights' bytes; as blocks the
committed builds pinned 1.30 × for Qwen-Image-2.1 and 1.48 × for FLUX.2 [klein] 4B).

The tensors of a committed model folder's weighted components, counted on the meta device in
bfloat16, are pinned one at a time as diffusers' ModuleGroup._to_cpu pins them: each a block of
its own (`blocks`), or carved out of pinned_weights' slabs, capped as the engine caps them
(`packed`). Per way: the page-locked bytes torch's pinned allocator took (host_memory_stats, its
cached blocks given back first) and the seconds to pin them all. The copies' values are not
filled (only the allocator's bytes are measured). Needs CUDA and some host RAM (about 40 GiB as
blocks for Qwen-Image-2.1, then freed); seconds of host time, no GPU memory.

    PYTHONPATH=src python benchmarks/pinned_weights.py [--model-folder models/qwen-image-2.1/full]
"""

from __future__ import annotations

import argparse
import sys
import time
from math import prod
from pathlib import Path

from omniprobe.config.diffusers import load_model_configs
from omniprobe_engine.diffusers_build import empty_components, pinned_mib, release_pinned_cache
from omniprobe_engine.pinned_slabs import Slabs, aligned
from omniprobe_engine.pinned_weights import MAX_SLAB_BYTES

TARGET_PACKED = 1.1
ROOT = Path(__file__).resolve().parent.parent


def tensor_shapes(folder: str) -> dict[str, list[tuple[int, ...]]]:
    """Each weighted component's parameter and buffer shapes, in order, on the meta device."""
    components = load_model_configs(ROOT, folder).engine_components()
    weighted = {name: spec for name, spec in components.items()
                if name not in ("tokenizer", "processor")}
    return {name: [tuple(t.shape) for t in [*module.parameters(), *module.buffers()]]
            for name, module in empty_components(weighted).items()}


def pin_all(torch, shapes: dict[str, list[tuple[int, ...]]], packed: bool) -> dict:
    release_pinned_cache(torch)
    before = pinned_mib(torch)
    held: list = []
    start = time.perf_counter()
    for component in shapes.values():
        slabs = (Slabs(pinned=True, max_slab_bytes=MAX_SLAB_BYTES,
                       expected_bytes=sum(aligned(2 * prod(s)) for s in component))
                 if packed else None)
        for shape in component:
            like = torch.empty(shape, dtype=torch.bfloat16, device="meta")
            held.append(slabs.empty_like(like) if packed
                        else torch.empty(shape, dtype=torch.bfloat16, pin_memory=True))
    took_s = time.perf_counter() - start
    took_mib = pinned_mib(torch) - before
    del held
    return {"way": "packed" if packed else "blocks", "pinned_gib": took_mib / 1024,
            "pin_s": took_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-folder", default="models/qwen-image-2.1/full")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("needs CUDA: page-locked host memory is a GPU's", file=sys.stderr)
        return 2
    shapes = tensor_shapes(args.model_folder)
    weights_gib = sum(2 * prod(s) for c in shapes.values() for s in c) / 2**30
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; {args.model_folder}: "
          f"{sum(len(c) for c in shapes.values())} tensors, {weights_gib:.2f} GiB in bfloat16")
    print(f"{'way':<8} {'pinned GiB':>10} {'x weights':>9} {'pin s':>7}")
    rows = [pin_all(torch, shapes, packed) for packed in (False, True)]
    for r in rows:
        print(f"{r['way']:<8} {r['pinned_gib']:>10.2f} {r['pinned_gib'] / weights_gib:>9.2f} "
              f"{r['pin_s']:>7.2f}")
    ratio = rows[1]["pinned_gib"] / weights_gib
    print(f"target: packed pins at most {TARGET_PACKED} x the weights: {ratio:.2f} "
          + ("met" if ratio <= TARGET_PACKED else "MISSED"))
    return 0 if ratio <= TARGET_PACKED else 1


if __name__ == "__main__":
    sys.exit(main())
