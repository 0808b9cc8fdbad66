"""The offline runner's results file, read as it grows (one JSON line per event), and each
request result checked against the runner protocol."""

from __future__ import annotations

from pathlib import Path

from omniprobe.errors import HarnessError
from omniprobe.harness.offline_plan import (
    PlannedRequest,
)
from omniprobe.safe_io import json_loads


class RunnerProtocolError(HarnessError):
    """The runner wrote something the protocol does not allow."""


class RunnerEvents:
    """The runner's results file, read as it grows; a line counts once it is complete."""

    def __init__(self, path: Path):
        self.path, self._offset, self._partial = path, 0, b""
        self._queue: list[dict] = []

    def next(self) -> dict | None:
        if not self._queue:
            self._read()
        return self._queue.pop(0) if self._queue else None

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in filter(bytes.strip, lines):
            try:
                event = json_loads(line)
            except ValueError:
                raise RunnerProtocolError(f"{self.path}: not a JSON line: {line[:200]!r}") from None
            if not isinstance(event, dict) or "event" not in event:
                raise RunnerProtocolError(f"{self.path}: a result without 'event': {line[:200]!r}")
            self._queue.append(event)


# What a runner's request result may carry beyond the protocol's own fields.
RESULT_MEASURES = ("peak_allocated_mib", "start_allocated_mib", "kv_cache_bytes", "kv_cache_layers",
             "kv_cache_layers_total", "prefix_tokens", "max_rss_mib", "host_peak_mib",
             "host_end_mib", "pinned_host_peak_mib", "process_mib", "outside_pool_mib")


def check_result(event: dict, planned: PlannedRequest, path: Path) -> None:
    """A request result as the protocol has it, for the request expected next."""
    wall = event.get("wall_s")
    if (event["event"] != "request" or event.get("id") != planned.id
            or event.get("outcome") not in ("ok", "oom", "error")
            or not isinstance(wall, int | float) or wall < 0):
        raise RunnerProtocolError(f"{path}: expected the result of {planned.id!r} with outcome "
                                  f"ok, oom or error and a wall_s, got {event}")


def after_last_event(log: str) -> str:
    """The log after the runner's last echoed result line: what the lost request left there."""
    at = log.rfind('{"event": ')
    return log if at < 0 else log[at:].partition("\n")[2]
