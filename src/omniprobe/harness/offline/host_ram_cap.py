"""Host RAM emulated with the card: a cgroup v2 `memory.max` over the runner's process tree.

Why this mechanism: the runner's host memory (offloaded weights, pinned buffers) is what a smaller
card's host would run out of, and a cgroup caps a whole process tree at once, with the kernel's own
OOM killer acting at the cap and `memory.events` counting each kill, as on a host that has only
that much RAM. It needs a writable cgroup v2 hierarchy with the memory controller (root, as on
the GPU machine); `ulimit -v` would cap address space instead (CUDA maps far more than it uses),
and a container's memory limit cannot be set from inside it. Swap is set to 0 in the cgroup: a
real host's zram cannot be emulated this way, and the report says so.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from omniprobe.errors import EnvironmentFailure
from omniprobe.evidence.models.offline import HostRamCheck
from omniprobe.harness.common.host_memory import oom_kills_in
from omniprobe_engine import cgroup_exec

CGROUP_ROOT_ENV = "OMNIPROBE_CGROUP_ROOT"  # default /sys/fs/cgroup; tests point it elsewhere
EXEC = Path(cgroup_exec.__file__)  # run as a script by the runner's Python, standard library only
MIB = 1024**2


class HostRamUnavailable(EnvironmentFailure):
    """The host RAM cap cannot be set here (no writable cgroup v2 with the memory controller)."""


def cgroup_root() -> Path:
    return Path(os.environ.get(CGROUP_ROOT_ENV, "/sys/fs/cgroup"))


def _memory_controller(root: Path) -> None:
    try:
        controllers = (root / "cgroup.controllers").read_text().split()
    except OSError as exc:
        raise HostRamUnavailable(f"host RAM cannot be capped: no cgroup v2 at {root} "
                                 f"({exc.strerror or exc})") from None
    if "memory" not in controllers:
        raise HostRamUnavailable(f"host RAM cannot be capped: {root} has no memory controller")


def _delegate_memory(root: Path) -> None:
    """Children of `root` get memory.max only where its subtree_control lists the controller
    (a fresh machine's root often does not); the kernel refuses it on a non-root cgroup that
    holds processes, and that refusal is the OSError the caller reports."""
    control = root / "cgroup.subtree_control"
    if control.exists() and "memory" not in control.read_text().split():
        control.write_text("+memory\n")


def require_host_ram_cap(root: Path | None = None) -> None:
    """HostRamUnavailable unless a cgroup can cap host RAM here: asked before a run starts."""
    _memory_controller(root or cgroup_root())


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def _clear_left_behind(folder: Path) -> None:
    """A cgroup of this name a killed run left: removed when no process is in it (its runner
    is gone), else named, for a run of it still goes on."""
    if not folder.exists():
        return
    try:
        pids = [p for p in (folder / "cgroup.procs").read_text().split() if _alive(p)]
    except OSError:
        pids = []
    if pids:
        raise HostRamUnavailable(f"host RAM cannot be capped: {folder} is left from an earlier "
                                 f"run and still holds process(es) {', '.join(pids)}; stop "
                                 "them, then run again")
    HostRamCap(folder, 0).remove()
    if folder.exists():
        raise HostRamUnavailable(f"host RAM cannot be capped: {folder} is left from an earlier "
                                 "run and cannot be removed; remove it (rmdir), then run again")


@dataclass
class HostRamCap:
    folder: Path
    cap_mib: int

    @classmethod
    def create(cls, name: str, cap_mib: int, root: Path | None = None) -> HostRamCap:
        root = root or cgroup_root()
        _memory_controller(root)
        folder = root / name
        _clear_left_behind(folder)
        try:
            _delegate_memory(root)
            folder.mkdir()
            (folder / "memory.max").write_text(f"{cap_mib * MIB}\n")
            if (folder / "memory.swap.max").exists():
                (folder / "memory.swap.max").write_text("0\n")
        except OSError as exc:
            raise HostRamUnavailable(f"host RAM cannot be capped: {folder}: "
                                     f"{exc.strerror or exc}") from None
        return cls(folder, cap_mib)

    def wrap(self, command: list[str], python: str) -> list[str]:
        """`command` run inside this cgroup from its first instruction."""
        return [python, str(EXEC), str(self.folder / "cgroup.procs"), "--", *command]

    def check(self) -> HostRamCheck:
        """What the cgroup saw: its peak and the kernel's OOM kills in it."""
        try:
            peak = int((self.folder / "memory.peak").read_text().split()[0]) / MIB
        except (OSError, ValueError, IndexError):
            peak = None
        return HostRamCheck(mechanism="cgroup-v2", cap_mib=self.cap_mib,
                            peak_mib=None if peak is None else round(peak, 1),
                            oom_kills=self.oom_kills() or 0)

    def oom_kills(self) -> int | None:
        """The kernel's OOM kills in this cgroup so far (None: not readable)."""
        return oom_kills_in(self.folder)

    def remove(self) -> None:
        """Remove the cgroup once its processes are gone (a real cgroup folder is removed with
        rmdir; a stand-in folder of tests is removed whole)."""
        try:
            self.folder.rmdir()
        except OSError:
            if not (self.folder / "cgroup.controllers").exists():
                shutil.rmtree(self.folder, ignore_errors=True)
