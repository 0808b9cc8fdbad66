"""A server a killed probe left behind, known by what its lifetime recorded: its process group
(the supervisor's pid) and when that supervisor started (boot id and start time in clock ticks,
from Linux /proc), so a pid reused by another process is never taken for it."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from omniprobe.evidence.models.runs import ServeRun

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _ticks(pid: int) -> int | None:
    """When a live process started (clock ticks since boot); None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else int(fields[19])


def started(pid: int) -> str | None:
    """'<boot id>/<start ticks>' of a live process; None when it is gone or /proc is absent."""
    ticks = _ticks(pid)
    try:
        boot = _BOOT_ID.read_text().strip()
    except OSError:
        return None
    return None if ticks is None else f"{boot}/{ticks}"


def _members(group: int, since: str) -> list[int]:
    """Live processes of `group` that started in this boot no earlier than its leader did."""
    boot, _, ticks = since.partition("/")
    if started(os.getpid()) is None or not started(os.getpid()).startswith(f"{boot}/"):
        return []  # another boot: every process is new, and the recorded group is gone
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        with contextlib.suppress(OSError):
            own = _ticks(pid)
            if os.getpgid(pid) == group and own is not None and own >= int(ticks):
                members.append(pid)
    return members


def stop_leftovers(runs: Iterable[ServeRun], grace_s: float = 5) -> list[str]:
    """Stop every server group a lifetime of `runs` recorded and never saw end (its probe was
    killed), if it still runs; one line per group stopped, for the user."""
    said = []
    for run in runs:
        for index, lifetime in enumerate(run.lifetimes):
            if lifetime.ended is not None or lifetime.server_group is None:
                continue
            group, since = lifetime.server_group, lifetime.server_started or ""
            if not _members(group, since):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while _members(group, since) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _members(group, since):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
                deadline = time.monotonic() + grace_s
                while _members(group, since) and time.monotonic() < deadline:
                    time.sleep(0.05)
            said.append(f"[{run.flag_set}] stopped the server of lifetime {index} (process group "
                        f"{group}), left running by a probe that was killed")
    return said
