"""Deterministic output images: a function of the prompt, the references, the seed and the size."""

from __future__ import annotations

import hashlib
import io

import numpy as np
from PIL import Image, ImageStat

# The seed report's fp8 collapse: ~97% transparent RGBA, alpha mean ~115, near-flat grey RGB.
_COLLAPSED_OPAQUE = 0.02
_COLLAPSED_ALPHA = (112.0, 40.0)
_COLLAPSED_GREY = (125.0, 6.0)


def _rng(prompt: str, references: list[bytes], seed: int, width: int, height: int):
    digest = hashlib.sha256()
    for part in (prompt.encode(), *references, f"{seed}:{width}x{height}".encode()):
        digest.update(hashlib.sha256(part).digest())
    return np.random.default_rng(int.from_bytes(digest.digest()[:8], "little"))


def _reference_tint(references: list[bytes]) -> np.ndarray:
    """Mean colour of the references, so different references give different pictures."""
    if not references:
        return np.array([128.0, 128.0, 128.0])
    # ImageStat sums a histogram in C: no float copy of a 1248x832 reference.
    means = [ImageStat.Stat(Image.open(io.BytesIO(r)).convert("RGB")).mean for r in references]
    return np.mean(np.array(means), axis=0)


def sound(prompt: str, references: list[bytes], seed: int, width: int, height: int) -> Image.Image:
    """A smooth, fully opaque picture: coarse random colour field, upsampled."""
    rng = _rng(prompt, references, seed, width, height)
    coarse = rng.normal(0, 45, size=(6, 9, 3)) + _reference_tint(references)
    field = Image.fromarray(coarse.clip(0, 255).astype(np.uint8), "RGB")
    return field.resize((width, height), Image.BILINEAR).convert("RGBA")


def collapsed(prompt: str, references: list[bytes], seed: int, width: int,
              height: int) -> Image.Image:
    """The broken fp8 output: mostly transparent grey noise."""
    rng = _rng(prompt, references, seed, width, height)
    def noise(mean_std: tuple[float, float]) -> np.ndarray:
        values = rng.standard_normal((height, width), dtype=np.float32)
        return values * mean_std[1] + mean_std[0]

    pixels = np.empty((height, width, 4), np.uint8)
    pixels[..., :3] = noise(_COLLAPSED_GREY).clip(0, 255)[..., None]
    alpha = noise(_COLLAPSED_ALPHA).clip(0, 254)
    alpha[rng.random((height, width), dtype=np.float32) < _COLLAPSED_OPAQUE] = 255
    pixels[..., 3] = alpha
    return Image.fromarray(pixels, "RGBA")


def kv_rounding(image: Image.Image, dtype: str, seed: int) -> Image.Image:
    """The same picture off by a level or two, as a quantized conditioning cache would leave it:
    sound, but not pixel-identical, so a propagation check can tell the knob arrived."""
    digest = hashlib.sha256(f"kv:{dtype}:{seed}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    pixels = np.asarray(image).astype(np.int16)
    pixels[..., :3] += rng.integers(-2, 3, size=pixels[..., :3].shape, dtype=np.int16)
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8), image.mode)


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG", compress_level=1)  # fast: the sim's own time is not the probe's
    return buffer.getvalue()
