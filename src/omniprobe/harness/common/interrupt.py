"""Ctrl-C, SIGTERM and SIGHUP during a session, delivered only where the harness looks for them.

The handler records the signal and nothing else: it never raises into whatever frame the signal
lands in (a urllib3 finalizer once swallowed such a KeyboardInterrupt, and the probe ran on to
exit 0). `signal.set_wakeup_fd` writes a byte to a pipe, so a wait in `pause` or `call` wakes at
once; `check` raises KeyboardInterrupt at a point the harness chose, where its cleanup runs.
No lock is taken in the handler (it may run while the main thread holds one).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_pending: list[int] = []  # signals received; appending is atomic, no lock needed
_wake: tuple[int, int] | None = None  # the pipe set_wakeup_fd writes to, while installed


def _record(signum: int, frame) -> None:
    _pending.append(signum)


def check() -> None:
    """Raise KeyboardInterrupt if a signal came: at a point of the harness's choosing."""
    if _pending:
        raise KeyboardInterrupt(f"signal {_pending[0]}")


def _drain() -> None:
    if _wake is not None:
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(_wake[0], 4096):
                pass


def pause(seconds: float) -> None:
    """Sleep, woken at once by a signal, which is then raised (check)."""
    check()
    if _wake is None:
        time.sleep(seconds)
        return
    select.select([_wake[0]], [], [], max(0.0, seconds))
    _drain()
    check()


def call(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) in a worker thread, so a signal ends the wait at once (check): a
    blocking call such as an HTTP request in flight never holds an interrupt back. The abandoned
    call ends when the caller's cleanup stops what it waits on (the server)."""
    check()
    if _wake is None:
        return fn(*args, **kwargs)
    box: dict[str, object] = {}
    write_end = _wake[1]

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as it was raised
            box["error"] = exc
        finally:
            with contextlib.suppress(OSError):
                os.write(write_end, b"\0")

    worker = threading.Thread(target=run, name="interruptible-call", daemon=True)
    worker.start()
    while worker.is_alive():
        select.select([_wake[0]], [], [], 0.5)
        _drain()
        check()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP are recorded, not raised, inside the block; on leaving it, one
    that came and was not yet raised is raised, so no interrupt is lost. Outside the main thread
    (no handlers can be set there) the block runs as it is."""
    global _wake
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    _pending.clear()
    previous = {sig: signal.signal(sig, _record) for sig in SIGNALS}
    old_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    _wake = (read_end, write_end)
    try:
        yield
        check()
    finally:
        signal.set_wakeup_fd(old_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _wake = None
        _pending.clear()
        os.close(read_end)
        os.close(write_end)
