"""The images an engine reads and writes: a reference opened as the server's upload path opens
it, and an output written so the harness never reads half a file."""

from __future__ import annotations

import os
from typing import Any


def open_reference(path: str) -> Any:
    """A reference image in the mode its file has, as the server's upload path hands it to the
    pipeline (it converts only when asked), so serve and offline runs get the same input."""
    from PIL import Image

    with Image.open(path) as image:
        image.load()
        return image.copy()


def save_png(image: Any, path: str) -> None:
    """Write a Pillow image atomically: the harness never reads half a file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        image.save(tmp, "PNG")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
