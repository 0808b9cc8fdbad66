"""Generated images for the tests: the seed report's broken fp8 signature and a sound one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def broken_signature(opaque_fraction: float = 0.03, alpha_mean: float = 115.0,
                     shape: tuple[int, int] = (208, 312), seed: int = 0) -> np.ndarray:
    """RGBA like the report's fp8 outputs: a few fully opaque pixels, the rest partly
    transparent around an alpha giving `alpha_mean` overall, near-flat grey noise for RGB."""
    rng = np.random.default_rng(seed)
    h, w = shape
    n = h * w
    opaque = round(opaque_fraction * n)
    rest_mean = (alpha_mean * n - 255 * opaque) / (n - opaque)
    alpha = np.clip(rng.normal(rest_mean, 20, n), 0, 254)
    alpha[rng.choice(n, opaque, replace=False)] = 255
    grey = np.clip(rng.normal(125, 4, n), 0, 255).round().astype(np.uint8)
    rgba = np.empty((n, 4), np.uint8)
    rgba[:, :3] = grey[:, None]
    rgba[:, 3] = alpha.round().astype(np.uint8)
    return rgba.reshape(h, w, 4)


def natural(shape: tuple[int, int] = (208, 312), seed: int = 0) -> np.ndarray:
    """A fully opaque scene: graded sky, textured ground, a sun disc, sensor noise."""
    rng = np.random.default_rng(seed)
    h, w = shape
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    rgb = np.empty((h, w, 3))
    sky = y < h * 0.55
    rgb[sky] = np.stack([90 + 60 * y / h, 140 + 60 * y / h, np.full_like(y, 230)], -1)[sky]
    ground = 80 + 30 * np.sin(x / 7) * np.cos(y / 5)
    rgb[~sky] = np.stack([ground * 0.6, ground, ground * 0.4], -1)[~sky]
    sun = (x - w * 0.7) ** 2 + (y - h * 0.25) ** 2 < (h * 0.1) ** 2
    rgb[sun] = (250, 220, 120)
    rgb += rng.normal(0, 3, rgb.shape)
    rgba = np.full((h, w, 4), 255, np.uint8)
    rgba[..., :3] = np.clip(rgb, 0, 255).round()
    return rgba


def perturbed(rgba: np.ndarray, sigma: float, seed: int = 1) -> np.ndarray:
    """`rgba` with Gaussian noise on its colour channels (alpha kept)."""
    rng = np.random.default_rng(seed)
    out = rgba.copy()
    noisy = rgba[..., :3] + rng.normal(0, sigma, rgba[..., :3].shape)
    out[..., :3] = np.clip(noisy, 0, 255).round()
    return out


def save(path: Path, array: np.ndarray, **params) -> Path:
    """Write `array` as an image file (format from the suffix), creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".png":
        params = {"compress_level": 1, **params}  # lossless at any level; 1 is the quick one
    Image.fromarray(array).save(path, **params)
    return path


def textbook_psnr(a: np.ndarray, b: np.ndarray, data_range: float) -> float:
    """PSNR as its definition reads, in float64: 10 log10(range^2 / mean squared error). The
    package's own sums the squared error exactly in integers; this is the reference it meets."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(data_range ** 2 / mse))
