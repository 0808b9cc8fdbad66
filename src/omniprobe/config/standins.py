"""The stand-in reference images: photograph-like pictures made from integers alone.

A stand-in fixture runs where the seed's own inputs are unknown (see fixtures/fixtures.json). Its
references are omniprobe's, drawn here from fixed seeds: a smooth two-colour gradient, value noise
at four scales (the finest a texture 4 pixels across), and a few solid shapes with hard edges and
their own shading. Every
step is integer arithmetic on a splitmix64 hash of (seed, layer, position), so every numpy version
on every platform draws the same pixels; no random-number stream is involved.

The PNG bytes of one picture may differ between Pillow or zlib versions while the pixels do not,
so the fixtures pin both: `sha256` of the committed file (what the server is sent, checked by
`validate` and the env check) and `pixels_sha256` of its decoded pixels (what regeneration must
reproduce).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_MIX1 = _U64(0xBF58476D1CE4E5B9)
_MIX2 = _U64(0x94D049BB133111EB)

# (lattice spacing in pixels, amplitude in levels): coarse light and shade down to fine texture;
# no per-pixel grain, which would triple the files' size.
OCTAVES = ((256, 48), (64, 20), (16, 8), (4, 3))
SHAPES = 7


@dataclass(frozen=True)
class StandinReference:
    """One stand-in reference image: where it lies under fixtures/ and how it is drawn."""

    name: str
    file: str
    seed: int
    width: int
    height: int


# The four pictures the stand-ins bind: the single stand-in takes a; the pair a, b; three a-c;
# four a-d. Their size is omniprobe's choice (the seed states none for its references).
STANDIN_REFERENCES = tuple(
    StandinReference(f"standin-ref-{letter}", f"standins/ref-{letter}.png", seed, 1024, 768)
    for letter, seed in zip("abcd", (1501, 1502, 1503, 1504), strict=True))


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 values (wrapping arithmetic, as the algorithm intends)."""
    x = x + _GOLDEN
    x = (x ^ (x >> _U64(30))) * _MIX1
    x = (x ^ (x >> _U64(27))) * _MIX2
    return x ^ (x >> _U64(31))


def hash_bytes(seed: int, layer: int, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """A value 0..255 for every (y, x) pair of the broadcast grids, fixed by seed and layer."""
    key = (_U64(seed) << _U64(40)) ^ (_U64(layer) << _U64(32))
    mixed = _mix(key ^ (ys.astype(_U64) << _U64(16)) ^ xs.astype(_U64))
    return (mixed >> _U64(56)).astype(np.int64)


def _smooth_weights(offset: np.ndarray, spacing: int) -> np.ndarray:
    """Smoothstep 3t^2 - 2t^3 on the integer offset within a cell, scaled by spacing^3."""
    return offset * offset * (3 * spacing - 2 * offset)


def value_noise(seed: int, layer: int, width: int, height: int, spacing: int) -> np.ndarray:
    """(height, width) values 0..255 interpolated smoothly between hashed lattice points."""
    ys, xs = np.arange(height, dtype=np.int64), np.arange(width, dtype=np.int64)
    gy, gx = ys // spacing, xs // spacing
    wy = _smooth_weights(ys % spacing, spacing)[:, None]
    wx = _smooth_weights(xs % spacing, spacing)[None, :]
    full = spacing ** 3

    # Hash each lattice point once, then look it up per pixel: the same values as hashing every
    # pixel's corners, at a spacing-squared fraction of the cost.
    lattice = hash_bytes(seed, layer, np.arange(gy[-1] + 2)[:, None], np.arange(gx[-1] + 2)[None, :])

    def corner(dy: int, dx: int) -> np.ndarray:
        return lattice[(gy + dy)[:, None], (gx + dx)[None, :]]

    top = corner(0, 0) * (full - wx) + corner(0, 1) * wx
    bottom = corner(1, 0) * (full - wx) + corner(1, 1) * wx
    return (top * (full - wy) + bottom * wy) // (full * full)


def _draws(seed: int, layer: int, count: int) -> list[int]:
    """`count` hashed values 0..255 for one seed and layer."""
    return hash_bytes(seed, layer, np.zeros(count, np.int64), np.arange(count)).tolist()


def reference_pixels(ref: StandinReference) -> np.ndarray:
    """The picture as (height, width, 3) uint8 RGB."""
    w, h, seed = ref.width, ref.height, ref.seed
    ys = np.arange(h, dtype=np.int64)[:, None]
    xs = np.arange(w, dtype=np.int64)[None, :]
    top = np.array(_draws(seed, 1, 3), dtype=np.int64)
    bottom = np.array(_draws(seed, 2, 3), dtype=np.int64)
    tilt = _draws(seed, 3, 1)[0] - 128  # the gradient leans left or right
    along = (ys * w + xs * tilt) * 1024 // (h * w + 128 * w)
    along = np.clip(along + 64, 0, 1024)
    channels = []
    for c in range(3):
        value = top[c] + (bottom[c] - top[c]) * along // 1024
        for octave, (spacing, amplitude) in enumerate(OCTAVES):
            noise = value_noise(seed, 10 + 4 * octave + c, w, h, spacing)
            value = value + (noise - 128) * amplitude // 128
        channels.append(value)
    picture = np.stack(channels, axis=-1)

    # Solid shapes with hard edges, each its own colour over the picture's shading.
    shading = value_noise(seed, 40, w, h, 128)[..., None] - 128
    for i in range(SHAPES):
        cx, cy, rx, ry, r, g, b, kind = _draws(seed, 100 + i, 8)
        cx, cy = cx * w // 256, cy * h // 256
        rx, ry = 24 + rx * w // 1024, 24 + ry * h // 1024
        if kind % 2:
            inside = (xs - cx) ** 2 * ry * ry + (ys - cy) ** 2 * rx * rx <= rx * rx * ry * ry
        else:
            inside = (abs(xs - cx) <= rx) & (abs(ys - cy) <= ry)
        colour = np.array([r, g, b], dtype=np.int64) + shading // 2 - ((ys - cy) * 48 // ry)[..., None]
        picture = np.where(inside[..., None], colour, picture)

    return np.clip(picture, 0, 255).astype(np.uint8)


def encode_png(pixels: np.ndarray) -> bytes:
    """RGB PNG bytes with fixed settings (no metadata, zlib level 9)."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG", compress_level=9)  # (h, w, 3) uint8: RGB
    return buffer.getvalue()
