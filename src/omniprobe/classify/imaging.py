"""Image metrics, the output-structure verdict, PSNR and pixel hashes (numpy + pillow).

Every image is first brought to one canonical form, RGBA at its own bit depth, by these rules:

    RGBA                 as stored
    RGB, CMYK, YCbCr     Pillow's conversion to RGB; alpha opaque
    L, 1                 grey copied to R, G and B; alpha opaque ("1" becomes 0 or 255)
    LA                   grey copied to R, G and B; alpha as stored
    P, PA                Pillow's palette lookup to RGBA: a transparency (tRNS) entry gives that
                         index its stored alpha; without one every pixel is opaque
    I;16, I;16B, I;16L   16-bit grey copied to R, G and B; alpha opaque (65535)
    I                    32-bit grey, accepted when every value fits 16 bits (how older Pillow
                         opens 16-bit PNGs), then as I;16

Any other mode (F, I;16S, LAB, HSV, ...) is refused with an error naming the file. Pillow itself
reduces 16-bit-per-channel colour PNGs to 8 bits when it opens them; an animated file is measured
on its first frame.

Figures are on the 0-255 scale whatever the depth (16-bit values divided by 257, so 65535 -> 255):

- opaque_fraction: share of pixels whose alpha is at least `opaque_alpha` (255: the report's count).
- alpha_mean: mean alpha.
- rgb_mean, rgb_std: mean and population standard deviation of every R, G and B value of every
  pixel, transparent ones included, as the report measured whole images.
- flatness: share of `flat_tile`-pixel square tiles that are near-constant, i.e. in which no RGB
  channel spans more than `flat_tolerance` levels; 1.0 is a blank image. Tiles start at the top-left
  corner; a remainder narrower than a tile is left out; an image smaller than a tile is one tile.

An image is broken when its opaque fraction is below `min_opaque_fraction`, its flatness above
`max_flat_fraction` (blank), or its rgb_std below `min_rgb_std` (near-flat: the seed's collapse
in an RGB output, which has no alpha to show it).
"""

from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image

from omniprobe.config.fixtures import MAX_SIDE_PX
from omniprobe.config.report_settings import StructureChecks
from omniprobe.errors import InputError, Problem
from omniprobe.evidence.models.requests import ImageMetrics
from omniprobe.safe_io import read_bytes

Comparator = Literal["rgba", "rgb"]
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp"})
_SIXTEEN_BIT = {"I;16": "I;16", "I;16B": "I;16", "I;16L": "I;16", "I;16N": "I;16", "I": "I;16"}
_VIA_RGB = {"RGB", "CMYK", "YCbCr"}
_VIA_RGBA = {"P", "PA"}
SUPPORTED_MODES = ("RGBA", *sorted(_VIA_RGB), "L", "1", "LA", *sorted(_VIA_RGBA), *_SIXTEEN_BIT)


# The largest image decoded: the largest output a fixture can ask for (fixtures.py bounds its
# width and height); a larger one would cost gigabytes to decode before anything refused it.
MAX_IMAGE_PIXELS = MAX_SIDE_PX * MAX_SIDE_PX
MAX_IMAGE_BYTES = MAX_IMAGE_PIXELS * 8  # 16-bit RGBA stored without compression


class UnreadableImage(InputError):
    """The file is missing, not an image, truncated, or in a mode this module does not convert."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__([Problem(str(path), "", reason)])


class ImageMismatch(InputError):
    """Two images cannot be compared pixel for pixel."""

    def __init__(self, a: Pixels, b: Pixels, what: str):
        super().__init__([Problem(a.name, "", f"cannot compare with {b.name}: {what}")])


@dataclass(frozen=True)
class Pixels:
    """An image in canonical form: (height, width, 4) RGBA, uint8 or uint16."""

    name: str
    mode: str
    rgba: np.ndarray

    @property
    def peak(self) -> int:
        return 65535 if self.rgba.dtype == np.uint16 else 255

    @property
    def width(self) -> int:
        return self.rgba.shape[1]

    @property
    def height(self) -> int:
        return self.rgba.shape[0]


# --- loading and canonical form --------------------------------------------------------------


def _with_alpha(colour: np.ndarray, alpha: np.ndarray | int) -> np.ndarray:
    """Stack an (h, w, 3) or (h, w) grey array with an alpha plane into (h, w, 4)."""
    out = np.empty((*colour.shape[:2], 4), dtype=colour.dtype)
    out[..., :3] = colour[..., None] if colour.ndim == 2 else colour
    out[..., 3] = alpha
    return out


def to_pixels(img: Image.Image, name: str) -> Pixels:
    """Canonical RGBA of a Pillow image by the module's documented rules."""
    mode = img.mode
    if img.width == 0 or img.height == 0:
        raise UnreadableImage(name, f"image has no pixels ({img.width}x{img.height})")
    if mode == "RGBA":
        return Pixels(name, mode, np.asarray(img))
    if mode in _VIA_RGB:
        return Pixels(name, mode, _with_alpha(np.asarray(img.convert("RGB")), 255))
    if mode in {"L", "1"}:
        return Pixels(name, mode, _with_alpha(np.asarray(img.convert("L")), 255))
    if mode == "LA":
        la = np.asarray(img)
        return Pixels(name, mode, _with_alpha(la[..., 0], la[..., 1]))
    if mode in _VIA_RGBA:
        return Pixels(name, mode, np.asarray(img.convert("RGBA")))
    if mode in _SIXTEEN_BIT:
        grey = np.asarray(img)
        if grey.size and (grey.min() < 0 or grey.max() > 65535):
            raise UnreadableImage(name, f"mode {mode} holds values {grey.min()}..{grey.max()}, "
                                        "outside the 16-bit range 0..65535 this module reads")
        return Pixels(name, _SIXTEEN_BIT[mode], _with_alpha(grey.astype(np.uint16), 65535))
    raise UnreadableImage(name, f"image mode {mode!r} is not supported "
                                f"(supported: {', '.join(SUPPORTED_MODES)})")


def load_pixels(path: str | Path) -> Pixels:
    """Open and decode an image file; UnreadableImage names the file and what went wrong."""
    path = Path(path)
    try:
        data = read_bytes(path, max_bytes=MAX_IMAGE_BYTES)  # a regular file only: no FIFO hangs
    except InputError as exc:
        raise UnreadableImage(path, exc.problems[0].message) from None
    return decode_pixels(data, str(path))


def decode_pixels(data: bytes, name: str) -> Pixels:
    """Decode an encoded image (a file's bytes, a server's answer); `name` is what errors call it."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size  # from the header: nothing is decoded yet
            if width * height > MAX_IMAGE_PIXELS:
                raise UnreadableImage(name, f"{width}x{height} is {width * height} pixels, over "
                                            f"the limit of {MAX_IMAGE_PIXELS} (the largest "
                                            f"output a fixture can ask for, {MAX_SIDE_PX}x"
                                            f"{MAX_SIDE_PX}); not decoded")
            img.load()
            return to_pixels(img, name)
    except Image.UnidentifiedImageError:
        raise UnreadableImage(name, "not an image Pillow can identify") from None
    except (OSError, Image.DecompressionBombError, SyntaxError, ValueError) as exc:
        # Pillow raises OSError for truncated data and SyntaxError for some corrupt headers.
        raise UnreadableImage(name, f"cannot read or decode: {exc}") from None


def pixels_sha256(px: Pixels) -> str:
    """sha256 of the canonical RGBA pixels (depth and size in a header, 16-bit as little-endian).

    Images whose canonical pixels agree hash alike whatever their file format or compression:
    an RGB PNG and a fully opaque RGBA PNG of the same colours are the same pixels.
    """
    header = f"rgba{8 if px.peak == 255 else 16} {px.width}x{px.height}\n".encode()
    data = px.rgba.astype("<u2", copy=False) if px.peak == 65535 else px.rgba
    digest = hashlib.sha256(header)
    digest.update(np.ascontiguousarray(data))  # the array's own buffer: no copy of the pixels
    return digest.hexdigest()


# --- metrics and the structure verdict -------------------------------------------------------


def channel_histograms(px: Pixels) -> tuple[np.ndarray, np.ndarray]:
    """Value counts of R, G and B pooled, and of alpha, each of length peak + 1."""
    if px.peak == 255:
        # Reading RGBA bytes as little-endian uint16 pairs (R|G<<8, B|A<<8) halves the values to
        # count; each 65536-bin joint histogram then splits back into its two channels.
        pairs = px.rgba.reshape(-1).view("<u2").reshape(-1, 2)
        rg = np.bincount(pairs[:, 0], minlength=65536).reshape(256, 256)  # [G, R]
        ba = np.bincount(pairs[:, 1], minlength=65536).reshape(256, 256)  # [A, B]
        return rg.sum(axis=0) + rg.sum(axis=1) + ba.sum(axis=0), ba.sum(axis=1)
    rgb = np.bincount(px.rgba[..., :3].reshape(-1), minlength=px.peak + 1)
    return rgb, np.bincount(px.rgba[..., 3].reshape(-1), minlength=px.peak + 1)


def _mean_std(counts: np.ndarray) -> tuple[float, float]:
    """Mean and population standard deviation of the values a histogram counts."""
    levels = np.arange(counts.size, dtype=np.float64)
    n = float(counts.sum())
    mean = float(counts @ levels) / n
    return mean, math.sqrt(float(counts @ (levels - mean) ** 2) / n)


def flat_fraction(rgba: np.ndarray, tile: int, tolerance: int) -> float:
    """Share of tile x tile blocks in which no R, G or B channel spans more than `tolerance`
    levels; alpha, the last of the four channels, is not looked at."""
    h, w, depth = rgba.shape
    sh, sw = min(tile, h), min(tile, w)
    th, tw = h // sh, w // sw
    # Whole RGBA rows, alpha and all: every step then runs over contiguous memory, many times
    # faster than over an RGB view, which skips every fourth value.
    rows = rgba[: th * sh, : tw * sw].reshape(th, sh, tw * sw * depth)
    hi = _fold(_fold(rows, np.maximum).reshape(th * tw, sw, depth), np.maximum)
    lo = _fold(_fold(rows, np.minimum).reshape(th * tw, sw, depth), np.minimum)
    return float(np.count_nonzero((hi[:, :3] - lo[:, :3]).max(axis=-1) <= tolerance)) / (th * tw)


def _fold(a: np.ndarray, op: np.ufunc) -> np.ndarray:
    """`op` (np.maximum or np.minimum) over axis 1, halving it each step; when its length is odd
    the two halves share the middle, which max and min do not mind."""
    while a.shape[1] > 1:
        half = (a.shape[1] + 1) // 2
        a = op(a[:, :half], a[:, -half:])
    return a[:, 0]


def structure_reasons(opaque_fraction: float, flatness: float, rgb_std: float,
                      cfg: StructureChecks) -> list[str]:
    """Why an image with these figures is broken under `cfg`; empty when it is sound. Opacity
    sees the seed's collapse only where the image has alpha; the spread of its RGB values sees
    it in an RGB output too (near-flat grey noise, which flatness misses)."""
    reasons = []
    if opaque_fraction < cfg.min_opaque_fraction:
        reasons.append(f"opaque fraction {opaque_fraction:.3f} < {cfg.min_opaque_fraction}")
    if flatness > cfg.max_flat_fraction:
        reasons.append(f"flatness {flatness:.3f} > {cfg.max_flat_fraction}: blank")
    if rgb_std < cfg.min_rgb_std:
        reasons.append(f"RGB std {rgb_std:.1f} < {cfg.min_rgb_std:g}: near-flat")
    return reasons


def measure(px: Pixels, cfg: StructureChecks) -> ImageMetrics:
    """The metrics and structure verdict of one canonical image."""
    per_level = px.peak // 255  # 1 for 8-bit, 257 for 16-bit: thresholds stay on the 0-255 scale
    rgb_counts, alpha_counts = channel_histograms(px)
    opaque = float(alpha_counts[cfg.opaque_alpha * per_level:].sum()) / (px.width * px.height)
    alpha_mean, _ = _mean_std(alpha_counts)
    rgb_mean, rgb_std = _mean_std(rgb_counts)
    flatness = flat_fraction(px.rgba, cfg.flat_tile, cfg.flat_tolerance * per_level)
    reasons = structure_reasons(opaque, flatness, rgb_std / per_level, cfg)
    return ImageMetrics(
        mode=px.mode,
        width=px.width,
        height=px.height,
        opaque_fraction=opaque,
        alpha_mean=alpha_mean / per_level,
        rgb_mean=rgb_mean / per_level,
        rgb_std=rgb_std / per_level,
        flatness=flatness,
        verdict="broken" if reasons else "sound",
        reasons=reasons,
    )


def image_metrics(path: str | Path, cfg: StructureChecks) -> ImageMetrics:
    return measure(load_pixels(path), cfg)


# --- PSNR --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Psnr:
    """PSNR of one pair; `db` is None when the pixels are identical (PSNR is infinite)."""

    comparator: Comparator
    data_range: float
    mse: float
    db: float | None

    @property
    def identical(self) -> bool:
        return self.mse == 0

    def as_json(self) -> dict:
        """A JSON-safe form: no infinity, `identical` said outright."""
        return {"comparator": self.comparator, "data_range": self.data_range, "mse": self.mse,
                "psnr_db": self.db, "identical": self.identical}


def _comparable(a: Pixels, b: Pixels, convert_modes: bool) -> tuple[np.ndarray, np.ndarray]:
    """The two RGBA arrays at one depth, or ImageMismatch saying what differs."""
    if (a.width, a.height) != (b.width, b.height):
        raise ImageMismatch(a, b, f"size {a.width}x{a.height} differs from {b.width}x{b.height}")
    if a.mode != b.mode and not convert_modes:
        raise ImageMismatch(a, b, f"mode {a.mode} differs from {b.mode}; convert one, or set "
                                  "convert_modes = true in hosts.toml [quality] to compare both "
                                  "as RGBA")
    if a.peak == b.peak:
        return a.rgba, b.rgba
    return _sixteen_bit(a), _sixteen_bit(b)


def _sixteen_bit(px: Pixels) -> np.ndarray:
    # 8-bit -> 16-bit by x257 is exact (255 -> 65535), so nothing is rounded.
    return px.rgba.astype(np.uint16) * 257 if px.peak == 255 else px.rgba


def psnr(a: Pixels, b: Pixels, comparator: Comparator = "rgba", *,
         data_range: float | None = None, convert_modes: bool = False) -> Psnr:
    """PSNR of `b` against `a` over RGBA or RGB; data range defaults to the depth's peak."""
    x, y = _comparable(a, b, convert_modes)
    peak = 65535 if x.dtype == np.uint16 else 255
    data_range = float(peak if data_range is None else data_range)
    if data_range <= 0:
        raise ValueError(f"data_range must be positive, got {data_range}")
    diff = np.maximum(x, y)
    diff -= np.minimum(x, y)  # |x - y| in the pixels' own type, over contiguous RGBA
    if comparator == "rgb":
        diff = diff[..., :3]
    # Exact integers throughout: each square fits the next wider type (255**2, 65535**2) and
    # the sum fits uint64, so nothing is rounded before the one division.
    wider = np.uint16 if diff.dtype == np.uint8 else np.uint32
    mse = int(np.square(diff, dtype=wider).sum(dtype=np.uint64)) / diff.size
    db = None if mse == 0 else 10 * math.log10(data_range**2 / mse)
    return Psnr(comparator, data_range, mse, db)
