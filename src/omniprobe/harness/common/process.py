"""A supervised process, the server or the offline runner: its command (env/serve_command.py
builds the server's) started in its own process group, waited on until it is ready or has failed,
and the whole group stopped on every exit path.

It runs under `omniprobe.harness.common.supervise`, which holds a pipe to this process: if the
harness dies, even by SIGKILL, the supervisor stops the group, so no orphan keeps GPU memory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from omniprobe.classify.failure_cause import classify_failure
from omniprobe.classify.oom import parse_oom
from omniprobe.errors import EnvironmentFailure, HarnessError
from omniprobe.evidence.models.common import FailureCause
from omniprobe.evidence.models.runs import InitResult
from omniprobe.harness.common.interrupt import pause
from omniprobe.harness.common.leftover import started
from omniprobe.harness.common.listening import listeners
from omniprobe.harness.common.logs import read_from
from omniprobe.harness.common.processes import alive
from omniprobe.harness.common.urls import host_port, url


class PortInUse(EnvironmentFailure):
    """Something else listens on the server's port."""


class PublicListener(HarnessError):
    """The server listens on an address other than loopback, whatever it was told: stopped."""


def require_port_free(host: str, port: int) -> None:
    """Raise PortInUse when something listens on host:port (binding as a server would)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise PortInUse(f"port {port} on {host} is already in use by another process; "
                            "stop it or choose another port with --port") from None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Endpoints:
    base_url: str
    health_path: str = "/health"
    ready_path: str | None = None


# How often a server that may answer (or exit) any moment is looked at: its readiness in its
# first second, its group while it stops.
QUICK_POLL_S = 0.02


def classify_exit(returncode: int, log_text: str, elapsed: float,
                  model_code: tuple[str, ...] = ()) -> InitResult:
    """A server that exited before it was ready: OOM at init when its log says so, else error;
    with the cause its log shows (the card, the server software, or the environment)."""
    cause = classify_failure(log_text, model_code)
    oom = parse_oom(log_text, "init", model_code)
    if oom is not None:
        return InitResult(outcome="oom", time_s=round(elapsed, 2), oom=oom, cause=cause)
    last = [line.strip() for line in log_text.splitlines() if line.strip()][-1:]
    return InitResult(outcome="error", time_s=round(elapsed, 2),
                      note=f"exited {returncode} before it was ready"
                      + (f": {last[0][:300]}" if last else ""), cause=cause)


def classify_hang(log_text: str, elapsed: float, timeout_s: float,
                  model_code: tuple[str, ...] = ()) -> InitResult:
    """A server not ready in time: a CUDA OOM its log shows before it hung is the card's answer,
    with the OOM's figures; anything else is a timeout, no answer of the card's (a resume starts
    it again unless the run accepts timeouts)."""
    oom = parse_oom(log_text, "init", model_code)
    if oom is not None:
        return InitResult(outcome="oom", time_s=round(elapsed, 2), oom=oom,
                          cause=classify_failure(log_text, model_code),
                          note=f"its log shows a CUDA out-of-memory error, then it hung until "
                               f"the {timeout_s:g} s ready timeout")
    return InitResult(outcome="timeout", time_s=round(elapsed, 2),
                      note=f"not ready after {timeout_s:g} s")


# Below this much room on the disk of its log, a server that exits at init may have died of it.
LOW_SPACE_BYTES = 1024 * 1024


def no_space_cause(folder: Path) -> FailureCause | None:
    """The environment as the cause of a failure, when the disk holding `folder` is full: the
    server's own log (where its reason would be) may not have been written either."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if free >= LOW_SPACE_BYTES:
        return None
    return FailureCause(kind="environment", reason=f"no space left on the disk of {folder} "
                                                   f"({free:,} bytes free)")


class SupervisedProcess:
    """One supervised process lifetime (a server, or the offline runner); as a context manager it
    stops the group however the block ends.

    `model_code`: where the model's frames are, for the location of an OOM at init."""

    def __init__(self, command: list[str], env: dict[str, str], log_path: Path,
                 endpoints: Endpoints | None, *, grace_s: float = 15,
                 model_code: tuple[str, ...] = ()):
        self.command, self.env, self.log_path = command, env, log_path
        self.endpoints, self.grace_s, self.model_code = endpoints, grace_s, model_code
        self.proc: subprocess.Popen | None = None
        self.started = 0.0
        self.started_at: str | None = None  # the supervisor's boot id and start ticks
        self._lifeline: int | None = None
        self.ended: str | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def __enter__(self) -> SupervisedProcess:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        if self.proc is not None:
            raise RuntimeError("this server lifetime has already been started")
        if self.endpoints is not None:  # None: a supervised process that serves no port
            require_port_free(*host_port(self.endpoints.base_url))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        read_end, self._lifeline = os.pipe()
        try:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "omniprobe.harness.common.supervise", "--lifeline", str(read_end),
                     "--grace", str(self.grace_s), "--", *self.command],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                    start_new_session=True, pass_fds=(read_end,))
        except BaseException:
            os.close(self._lifeline)
            self._lifeline = None
            raise
        finally:
            os.close(read_end)
        self.started = time.monotonic()
        self.started_at = started(self.proc.pid)

    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit status once the server has exited, or None if it still runs after timeout_s."""
        try:
            return self.proc.wait(timeout=timeout_s) if self.proc else None
        except subprocess.TimeoutExpired:
            return None

    def _get(self, path: str, timeout: float) -> int | None:
        try:
            return requests.get(url(self.endpoints.base_url, path), timeout=timeout).status_code
        except requests.RequestException:
            return None

    def wait_ready(self, timeout_s: float, poll_s: float = 0.5) -> InitResult:
        """Ready when /health (and the ready path, if any) answers 200; failed if it exits first.

        For the first second polls come every QUICK_POLL_S, then they back off to poll_s: a
        quick start is timed to within a few tens of ms, and a slow one costs few requests."""
        delay_s = min(QUICK_POLL_S, poll_s)
        while True:
            elapsed = time.monotonic() - self.started
            code = self.returncode()
            if code is not None:
                result = classify_exit(code, read_from(self.log_path), elapsed,
                                       self.model_code)
                full = None if result.cause is not None else no_space_cause(self.log_path.parent)
                return result if full is None else result.model_copy(update={"cause": full})
            if self._get(self.endpoints.health_path, 2) == 200 and (
                    self.endpoints.ready_path is None
                    or self._get(self.endpoints.ready_path, 2) == 200):
                self.require_loopback_only()
                return InitResult(outcome="ready", time_s=round(elapsed, 2))
            if elapsed >= timeout_s:
                return classify_hang(read_from(self.log_path), elapsed, timeout_s,
                                     self.model_code)
            pause(min(delay_s, max(0.0, timeout_s - elapsed)))
            if elapsed >= 1.0:
                delay_s = min(2 * delay_s, poll_s)

    def require_loopback_only(self) -> None:
        """Stop the server and raise PublicListener if any of its processes listens anywhere but
        loopback (it was told 127.0.0.1; an argument or its own code may have overridden it)."""
        public = [item for item in listeners(self.proc.pid) if not item.loopback]
        if public:
            self.stop()
            raise PublicListener(
                f"the server listened on {', '.join(map(str, public))}, not only on 127.0.0.1 as "
                f"the harness told it; it was stopped ({self.ended}). Check the serve command "
                "and the flag set's arguments")

    def stop(self) -> str:
        """SIGTERM to the group, the grace period, then SIGKILL; returns how it ended."""
        if self.proc is None or self.ended is not None:
            return self.ended or "never started"
        code = self.proc.poll()
        if code is not None and not alive(self.proc.pid, group=True):
            self.ended = f"exited {code}"
        else:
            self.ended = self._terminate()
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        return self.ended

    def _terminate(self) -> str:
        pgid = self.proc.pid
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline:
            self.proc.poll()
            if not alive(pgid, group=True):
                return "stopped"
            time.sleep(QUICK_POLL_S)
        _signal_group(pgid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + 5
        while alive(pgid, group=True) and time.monotonic() < deadline:
            time.sleep(0.05)
        return f"killed after {self.grace_s:g} s grace"


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)

