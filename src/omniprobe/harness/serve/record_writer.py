"""Writing a serve request's record off the request path, in order; a flag set's run from its
lifetimes."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from omniprobe.errors import EnvironmentFailure
from omniprobe.evidence.models.runs import ServerLifetime, ServeRun


def run_from_lifetimes(flag_set: str, lifetimes: list[ServerLifetime]) -> ServeRun:
    """A flag set's run: the latest lifetime's init, the device peak over all of them."""
    timelines = [lt.timeline for lt in lifetimes if lt.timeline and lt.timeline.state == "sampled"]
    peaks = [t.device_peak_mib for t in timelines if t.device_peak_mib is not None]
    samplers = sorted({f"{t.sampler} at {t.target_hz:g} Hz" for t in timelines})
    return ServeRun(flag_set=flag_set, init=lifetimes[-1].init,
                    gpu_peak_mib=round(max(peaks)) if peaks else None,
                    gpu_sampler=", ".join(samplers) or None, lifetimes=lifetimes)


class RecordNotWritten(EnvironmentFailure):
    """A request's record or image could not be written (the disk is full or read-only)."""


class RecordWriter:
    """Finishes each record off the request path, in order: decoding the image for its pixel
    hash and structure metrics costs more than the rest of the harness, and overlaps the next
    request this way."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recorder")
        self._pending: list[Future] = []

    def submit(self, fn, *args) -> None:
        self._pending.append(self._pool.submit(fn, *args))

    def drain(self) -> None:
        """Wait for every submitted record; a failure to write one is raised here, as the
        machine's (a full or read-only disk), once every other record had its chance."""
        pending, self._pending = self._pending, []
        failed: list[OSError] = []
        for future in pending:
            try:
                future.result()
            except OSError as exc:
                failed.append(exc)
        if failed:
            raise RecordNotWritten(
                f"{len(failed)} request record(s) could not be written ({failed[0]}); the "
                "attempt holds every request shown above: free the space and re-run to resume")

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._pool.shutdown()
