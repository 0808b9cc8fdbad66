"""What a server's or runner's log says, as plain lines (classify/log_text.py: no colour codes,
no vLLM prefixes), and shortened for an error message."""

from __future__ import annotations

from pathlib import Path

from omniprobe.classify.log_text import plain_log
from omniprobe.protocol import DEPLOY_IGNORED_WARNING


def read_from(path: Path, offset: int = 0) -> str:
    """The log's plain text written since `offset` bytes (undecodable bytes replaced)."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        return plain_log(handle.read().decode("utf-8", "replace"))


def deploy_config_ignored(log: str) -> bool:
    """Whether a server's log says upstream ignored its deploy config."""
    return DEPLOY_IGNORED_WARNING in log


def log_tail(text: str, lines: int = 2, max_chars: int = 400) -> str:
    """The last non-blank lines, joined by ' | ' and cut to max_chars; '(nothing new)' if none."""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[:max_chars] or "(nothing new)"
