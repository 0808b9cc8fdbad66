"""Deterministic output images: a function of the prompt, the references, the seed and the size.

Drawn with PIL alone, from `random.Random` streams: a server start costs no numpy import, and
every per-pixel step (noise, its distribution, clipping) runs in PIL's C code.
"""

from __future__ import annotations

import hashlib
import io
import random
from functools import cache
from statistics import NormalDist

from PIL import Image, ImageChops, ImageStat

# The seed report's fp8 collapse: ~97% transparent RGBA, alpha mean ~115, near-flat grey RGB.
_COLLAPSED_OPAQUE = 0.02
_COLLAPSED_ALPHA = (112.0, 40.0)
_COLLAPSED_GREY = (125.0, 6.0)


def _rng(prompt: str, references: list[bytes], seed: int, width: int, height: int) -> random.Random:
    digest = hashlib.sha256()
    for part in (prompt.encode(), *references, f"{seed}:{width}x{height}".encode()):
        digest.update(hashlib.sha256(part).digest())
    return random.Random(int.from_bytes(digest.digest()[:8], "little"))


@cache
def _normal_lut(mean: float, std: float, top: int) -> tuple[int, ...]:
    """Uniform bytes -> a normal distribution's quantiles, rounded and clipped to 0..top."""
    quantile = NormalDist(mean, std).inv_cdf
    return tuple(min(top, max(0, round(quantile((i + 0.5) / 256)))) for i in range(256))


def _noise(rng: random.Random, size: tuple[int, int], lut) -> Image.Image:
    """A greyscale plane of independent draws, mapped through `lut` (256 entries)."""
    return Image.frombytes("L", size, rng.randbytes(size[0] * size[1])).point(list(lut))


def _reference_tint(references: list[bytes]) -> list[float]:
    """Mean colour of the references, so different references give different pictures."""
    if not references:
        return [128.0, 128.0, 128.0]
    # ImageStat sums a histogram in C: no float copy of a 1248x832 reference.
    means = [ImageStat.Stat(Image.open(io.BytesIO(r)).convert("RGB")).mean for r in references]
    return [sum(channel) / len(means) for channel in zip(*means, strict=True)]


def sound(prompt: str, references: list[bytes], seed: int, width: int, height: int) -> Image.Image:
    """A smooth, fully opaque picture: coarse random colour field, upsampled."""
    rng = _rng(prompt, references, seed, width, height)
    tint = _reference_tint(references)
    coarse = bytes(min(255, max(0, int(rng.gauss(0, 45) + tint[i % 3]))) for i in range(6 * 9 * 3))
    field = Image.frombytes("RGB", (9, 6), coarse)
    return field.resize((width, height), Image.BILINEAR).convert("RGBA")


def collapsed(prompt: str, references: list[bytes], seed: int, width: int,
              height: int) -> Image.Image:
    """The broken fp8 output: mostly transparent grey noise."""
    rng = _rng(prompt, references, seed, width, height)
    size = (width, height)
    grey = _noise(rng, size, _normal_lut(*_COLLAPSED_GREY, 255))
    alpha = _noise(rng, size, _normal_lut(*_COLLAPSED_ALPHA, 254))
    opaque_below = round(_COLLAPSED_OPAQUE * 256)
    opaque = _noise(rng, size, tuple(255 if i < opaque_below else 0 for i in range(256)))
    return Image.merge("RGBA", (grey, grey, grey, ImageChops.lighter(alpha, opaque)))


def kv_rounding(image: Image.Image, dtype: str, seed: int) -> Image.Image:
    """The same picture off by a level or two, as a quantized conditioning cache would leave it:
    sound, but not pixel-identical, so a propagation check can tell the knob arrived."""
    digest = hashlib.sha256(f"kv:{dtype}:{seed}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "little"))
    levels = [i % 5 for i in range(256)]  # 0..4, shifted to -2..+2 below
    *rgb, alpha = image.convert("RGBA").split()
    moved = [ImageChops.add(band, _noise(rng, image.size, levels), offset=-2) for band in rgb]
    return Image.merge("RGBA", (*moved, alpha)).convert(image.mode)


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG", compress_level=1)  # fast: the sim's own time is not the probe's
    return buffer.getvalue()
