"""Whether a process, or a process group, still exists."""

from __future__ import annotations

import os


def alive(pid: int, *, group: bool = False) -> bool:
    """Signal 0 to the process (or every process of group `pid`): delivered or refused for want
    of permission means it exists; no such process means it is gone."""
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
