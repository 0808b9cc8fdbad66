"""`omniprobe standins`: draw the stand-in reference images, or check the committed ones.

Drawing keeps a committed file whose pixels are already right, so its bytes (and the sha256 the
fixtures pin) stay put on an encoder that would compress them differently. Checking compares
each picture's pixels, freshly drawn, with the `pixels_sha256` fixtures/fixtures.json pins, and
each committed file's bytes with its `sha256`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omniprobe.atomic import write_bytes_atomic
from omniprobe.classify.imaging import UnreadableImage, load_pixels, pixels_sha256, to_pixels
from omniprobe.config.fixtures import FixtureSuite, ReferenceImage
from omniprobe.config.standins import (
    STANDIN_REFERENCES,
    StandinReference,
    encode_png,
    reference_pixels,
)
from omniprobe.digests import sha256_bytes


@dataclass(frozen=True)
class Drawn:
    """One stand-in reference: its digests as drawn, and what the committed file holds."""

    ref: StandinReference
    path: Path
    pixels_sha256: str
    file_sha256: str | None  # the committed file's bytes; None: no file
    file_pixels_sha256: str | None


def draw_pixels_sha256(ref: StandinReference) -> str:
    from PIL import Image

    return pixels_sha256(to_pixels(Image.fromarray(reference_pixels(ref)), ref.file))


def _file_digests(path: Path) -> tuple[str | None, str | None]:
    try:
        data = path.read_bytes()
        return sha256_bytes(data), pixels_sha256(load_pixels(path))
    except (OSError, UnreadableImage):
        return None, None


def draw(fixtures_dir: Path, *, write: bool) -> list[Drawn]:
    """Every stand-in reference drawn; with write, (re)written where the file's pixels differ."""
    out = []
    for ref in STANDIN_REFERENCES:
        path = fixtures_dir / ref.file
        pixels = reference_pixels(ref)
        drawn = draw_pixels_sha256(ref)
        file_sha, file_pixels = _file_digests(path)
        if write and file_pixels != drawn:
            write_bytes_atomic(path, encode_png(pixels))
            file_sha, file_pixels = _file_digests(path)
        out.append(Drawn(ref, path, drawn, file_sha, file_pixels))
    return out


def _pinned(suite: FixtureSuite, ref: StandinReference) -> list[ReferenceImage]:
    return [r for f in suite.fixtures for r in f.references or [] if r.file == ref.file]


def standin_problems(suite: FixtureSuite, drawn: list[Drawn]) -> list[str]:
    """Where the drawn pictures, the committed files and the fixtures' pins disagree."""
    found = []
    for d in drawn:
        pins = _pinned(suite, d.ref)
        if not pins:
            found.append(f"{d.ref.file}: no fixture binds it")
        if d.file_sha256 is None:
            found.append(f"{d.ref.file}: missing or unreadable; run `omniprobe standins`")
        elif d.file_pixels_sha256 != d.pixels_sha256:
            found.append(f"{d.ref.file}: its pixels are not the generator's")
        for pin in pins:
            if pin.pixels_sha256 != d.pixels_sha256:
                found.append(f"{d.ref.file}: drawn pixels sha256 {d.pixels_sha256}, fixtures pin "
                             f"{pin.pixels_sha256} for {pin.name!r}")
            if d.file_sha256 is not None and pin.sha256 != d.file_sha256:
                found.append(f"{d.ref.file}: file sha256 {d.file_sha256}, fixtures pin "
                             f"{pin.sha256} for {pin.name!r}")
    return found


def render(drawn: list[Drawn]) -> str:
    return "\n".join(f"{d.ref.file}: {d.ref.width}x{d.ref.height}, sha256 {d.file_sha256}, "
                     f"pixels_sha256 {d.pixels_sha256}" for d in drawn)
