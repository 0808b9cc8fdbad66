"""Runs a command inside a cgroup: `python cgroup_exec.py PROCS_FILE -- COMMAND...` writes its own
pid to the cgroup's cgroup.procs, then becomes COMMAND (exec), so the command and every process
it starts are under the cgroup's limits from their first instruction.

Standard library only: it runs before the command, in whatever Python starts it.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: cgroup_exec.py PROCS_FILE -- COMMAND...", file=sys.stderr)
        return 2
    procs, command = argv[0], argv[2:]
    try:
        with open(procs, "w", encoding="ascii") as handle:
            handle.write(f"{os.getpid()}\n")
    except OSError as exc:
        print(f"cgroup_exec: cannot join the cgroup ({procs}): {exc}", file=sys.stderr)
        return 4
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"cgroup_exec: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
