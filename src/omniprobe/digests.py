"""SHA-256 digests as lowercase hex: of bytes, of a file read in blocks, of a JSON value."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def sha256_json(value: object) -> str:
    """The digest of a JSON value with sorted keys, so equal values hash equal."""
    return sha256_bytes(json.dumps(value, sort_keys=True).encode())
