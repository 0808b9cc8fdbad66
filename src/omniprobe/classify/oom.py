"""PyTorch's CUDA out-of-memory text, from a server log or an HTTP error body, as a signature."""

from __future__ import annotations

import re

from omniprobe.evidence.models.common import CodeRef, OomSignature
from omniprobe.safe_io import json_loads

_SIZE = r"(\d+(?:\.\d+)? ?(?:bytes|KiB|MiB|GiB|TiB))"
_FIELDS = {
    "requested": rf"Tried to allocate {_SIZE}",
    "total_capacity": rf"total capacity of {_SIZE}",
    "in_use": rf"this process has {_SIZE} memory in use",
    "allowed": rf"{_SIZE} allowed;",
    "allocated": rf"Of the allocated memory {_SIZE} is allocated by PyTorch",
    "reserved_unallocated": rf"and {_SIZE} is reserved by PyTorch but unallocated",
}
# PyTorch before 2.1 wrote "(GPU 0; 23.69 GiB total capacity; 21.83 GiB already allocated; ...)".
_OLD_FIELDS = {
    "total_capacity": rf"{_SIZE} total capacity",
    "allocated": rf"{_SIZE} already allocated",
}
_MARKER = re.compile(r"CUDA out of memory|OutOfMemoryError")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_TRACEBACK = "Traceback (most recent call last):"
# Python's words between the tracebacks of a chain (`raise ... from e`, or a raise in `except`).
_CHAINED = ("The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:")
_LIBRARY = ("/torch/", "<frozen ", "/lib/python3")


def is_oom(text: str) -> bool:
    return bool(_MARKER.search(text))


def error_message(body: str) -> str:
    """The message of `{"error": {"message": ...}}`, `{"detail": ...}` or a plain-text body."""
    try:
        data = json_loads(body)
    except ValueError:  # not JSON, or a key twice: the body's text is the message
        return body
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
        if isinstance(data.get("detail"), str):
            return data["detail"]
    return body


def _sizes(message: str) -> dict[str, str]:
    flat = " ".join(message.split())
    found = {}
    for name, pattern in _FIELDS.items():
        match = re.search(pattern, flat)
        if match:
            found[name] = match.group(1)
    if "total_capacity" not in found:
        for name, pattern in _OLD_FIELDS.items():
            match = re.search(pattern, flat)
            if match:
                found[name] = match.group(1)
    return found


def _short_path(path: str, model_code: tuple[str, ...]) -> str:
    for marker in model_code:
        at = path.find(marker)
        if at >= 0:
            return path[at:]
    return path


def traceback_frames(text: str) -> list[dict[str, str]]:
    """Every `File "...", line N, in f` frame of the text, outermost first."""
    return [m.groupdict() for m in _FRAME.finditer(text)]


def innermost_model_frame(traceback_text: str,
                          model_code: tuple[str, ...] = ()) -> CodeRef | None:
    """The innermost frame in model code; else the innermost outside torch and the stdlib."""
    frames = traceback_frames(traceback_text)
    for wanted in (lambda f: any(m in f["file"] for m in model_code),
                   lambda f: not any(m in f["file"] for m in _LIBRARY)):
        for frame in reversed(frames):
            if wanted(frame):
                return CodeRef(file=_short_path(frame["file"], model_code), lines=frame["line"],
                               function=frame["func"])
    return None


def _oom_messages(text: str) -> list[tuple[int, dict[str, str]]]:
    """Each OOM mention's start and the sizes of its text up to the next mention."""
    starts = [match.start() for match in _MARKER.finditer(text)]
    return [(at, _sizes(text[at:end])) for at, end in zip(starts, [*starts[1:], len(text)], strict=True)]


def _fullest_message(text: str) -> tuple[int, dict[str, str]]:
    """The mention stating the most sizes (the last of equals): a later short re-statement
    ("CUDA out of memory" from the API server, a re-raise) must not hide the full message."""
    messages = _oom_messages(text)
    return max(reversed(messages), key=lambda message: len(message[1]))


def _chain_blocks(text: str, end: int) -> list[str]:
    """The tracebacks of the exception chain whose message is at `end`, the original first: a
    chained re-raise shows the original's traceback above its own."""
    start = text.rfind(_TRACEBACK, 0, end)
    if start < 0:
        return []
    starts = [start]
    while True:
        before = text[:starts[0]].rstrip()
        if not before.endswith(_CHAINED):
            break
        earlier = text.rfind(_TRACEBACK, 0, len(before))
        if earlier < 0:
            break
        starts.insert(0, earlier)
    return [text[a:b] for a, b in zip(starts, [*starts[1:], end], strict=True)]


def oom_location(text: str, at: int, model_code: tuple[str, ...]) -> CodeRef | None:
    """Where the OOM whose message is at `at` was raised: the innermost model frame of the
    original exception of its chain, else of the next one that has such a frame."""
    for block in _chain_blocks(text, at):
        found = innermost_model_frame(block, model_code)
        if found is not None:
            return found
    return None


def parse_oom(text: str, phase: str,
              model_code: tuple[str, ...] = ()) -> OomSignature | None:
    """Parse an OOM message or a whole log; None when the text holds no CUDA OOM.

    Sizes come from the fullest OOM message, its location from that message's traceback chain.
    `model_code`: path fragments of the model's source files (hosts.toml model_code); none (an
    HTTP body, which has no traceback) takes the innermost frame outside torch and the stdlib."""
    if not is_oom(text):
        return None
    at, sizes = _fullest_message(text)
    return OomSignature(phase=phase, location=oom_location(text, at, model_code), **sizes)


def merge(body: OomSignature | None, log: OomSignature | None) -> OomSignature | None:
    """The HTTP body's figures with the log's code location (bodies carry no traceback)."""
    if body is None or log is None:
        return body or log
    return body.model_copy(update={"location": body.location or log.location})
