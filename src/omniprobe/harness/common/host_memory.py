"""The host's memory as the kernel tells it: the memory available (/proc/meminfo MemAvailable)
and the OOM killer's count of this process's cgroup (cgroup v2 memory.events `oom_kill`, which
counts the kills in the cgroups below it too: the servers and runners the harness starts stay in
its cgroup). None where the kernel does not show them (not Linux, cgroup v1, a container that
hides them)."""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def available_mib(proc: Path = PROC) -> float | None:
    try:
        text = (proc / "meminfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024  # kB
    return None


def oom_kill_count(proc: Path = PROC, cgroup_root: Path = CGROUP_ROOT) -> int | None:
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    unified = [line[3:] for line in lines if line.startswith("0::")]  # "0::/user.slice/..."
    if not unified:
        return None
    return oom_kills_in(cgroup_root / unified[0].lstrip("/"))


def oom_kills_in(cgroup: Path) -> int | None:
    """A cgroup's `memory.events` `oom_kill` count; None where it cannot be read."""
    try:
        events = (cgroup / "memory.events").read_text()
    except OSError:
        return None
    for line in events.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None
