"""What a server's or runner's log says, shortened for an error message."""

from __future__ import annotations

from pathlib import Path


def read_from(path: Path, offset: int) -> str:
    """The log's text written since `offset` bytes (undecodable bytes replaced)."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode("utf-8", "replace")


def log_tail(text: str, lines: int = 2, max_chars: int = 400) -> str:
    """The last non-blank lines, joined by ' | ' and cut to max_chars; '(nothing new)' if none."""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[:max_chars] or "(nothing new)"
