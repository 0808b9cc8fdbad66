"""The conditioning cache in pinned host memory against a host-RAM cap: a profile that keeps the
cache page-locked on the host (kv_placement = "host-pinned") under an emulated host's RAM cap
smaller than the cache at the asked count is refused before any build, since no swap can take
page-locked memory and the kernel would kill the runner mid-request.

The cache's size is a lower bound from the DiT's config: every block keeps K and V, heads × head
dimension elements of the dtype per prefix token, and a reference of side S brings (S / 16)²
prefix tokens (QwenImage21Pipeline packs 2×2 patches of the VAE's 8× downsampled latents;
omniprobe counted 4,144 at 1024², this 4,096 and the condition's own tokens). Each layer's K and
V is one pinned block, and torch's pinned host allocator rounds a block up to a power of two;
packed (kv_placement = "host-pinned-packed"), they are carved out of slabs by the engine's own
rule (omniprobe_engine.pinned_slabs), which this reads rather than restates.
"""

from __future__ import annotations

from omniprobe.config.diffusers import DiffusersProfile
from omniprobe.errors import Problem
from omniprobe_engine.kv_host import HOST_PLACEMENTS, is_pinned
from omniprobe_engine.pinned_slabs import packed_bytes, power_of_two_ceil

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
PIXELS_PER_TOKEN_SIDE = 16  # the VAE's 8x downsampling, then 2x2 latent patches


def cached_layers(transformer: dict) -> int:
    """The blocks that keep K and V: every one, FLUX.2's single-stream blocks too."""
    return transformer["num_layers"] + transformer.get("num_single_layers", 0)


def architecture_bytes_per_token(transformer: dict, dtype: str = "bfloat16") -> int:
    """What the DiT's config implies the cache holds per prefix token: every block keeps K and V,
    each heads × head dimension elements."""
    return cached_layers(transformer) * 2 * _tensor_bytes_per_token(transformer, dtype)


def _tensor_bytes_per_token(transformer: dict, dtype: str) -> int:
    return (transformer["num_attention_heads"] * transformer["attention_head_dim"]
            * DTYPE_BYTES[dtype])


def pinned_cache_bytes(transformer: dict, dtype: str, resolution: int, references: int,
                       packed: bool = False) -> int:
    """At least what the cache of `references` condition images of side `resolution` pins: one
    block per layer's K and per its V, or, `packed`, the slabs they are carved out of."""
    tokens = (resolution // PIXELS_PER_TOKEN_SIDE) ** 2 * references
    per_tensor = tokens * _tensor_bytes_per_token(transformer, dtype)
    tensors = cached_layers(transformer) * 2
    return packed_bytes(per_tensor, tensors) if packed else tensors * power_of_two_ceil(per_tensor)


def pinned_cache_problems(profiles: dict[str, DiffusersProfile], transformer: dict,
                          resolution_of: dict[str, int], references: int,
                          host_ram_gib: float | None, host: str,
                          hosts_file: str) -> list[Problem]:
    """Each profile of `host` whose pinned cache at `references` outgrows its RAM cap."""
    if host_ram_gib is None:
        return []
    cap = host_ram_gib * 2**30
    out = []
    for name, profile in profiles.items():
        # a host placement implies the cache (DiffusersProfile's own check)
        if not is_pinned(profile.kv_placement):
            continue
        need = pinned_cache_bytes(transformer, profile.dtype, resolution_of[name], references,
                                  HOST_PLACEMENTS[profile.kv_placement].packed)
        if need > cap:
            out.append(Problem(hosts_file, f"[diffusers_profiles.{name}] key 'kv_placement'",
                               f"the cache pinned on the host at {references} references holds "
                               f"at least {need / 2**30:.1f} GiB, more than host {host}'s "
                               f"{host_ram_gib:g} GiB RAM cap, and page-locked memory cannot "
                               "swap; expected 'host-pageable', fewer references, or a larger "
                               "host_ram_gib"))
    return out
