"""`python -m omniprobe.harness.common.supervise --lifeline FD --grace S -- CMD...`: the server's keeper.

The harness starts this as the leader of a new process group, holding the write end of a pipe
whose read end is FD. The supervisor runs CMD in the same group and exits with its status. When
the pipe reaches end-of-file (the harness has exited, even by SIGKILL) it stops the whole group:
SIGTERM, a grace period, SIGKILL. So no server outlives the harness that started it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> None:
    """In the server, before exec: the kernel kills it when this keeper dies, even by SIGKILL
    together with the harness, when neither the lifeline nor the keeper is left to stop it."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _stop_group(child: subprocess.Popen, grace_s: float) -> None:
    print("omniprobe.harness.common.supervise: the harness is gone; stopping the server group",
          file=sys.stderr, flush=True)
    os.killpg(os.getpgid(0), signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=grace_s)
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _watch(lifeline: int, child: subprocess.Popen, grace_s: float) -> None:
    while os.read(lifeline, 1):
        pass
    _stop_group(child, grace_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m omniprobe.harness.common.supervise")
    parser.add_argument("--lifeline", type=int, required=True)
    parser.add_argument("--grace", type=float, default=15)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to supervise")
    # The group's SIGTERM/SIGINT are for the server; the keeper stays to reap it and report.
    # A handler, not SIG_IGN: exec resets handlers but would pass SIG_IGN to the server. It notes
    # each signal, for one that comes before the server exists.
    asked: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: asked.append(signum))
    try:
        child = subprocess.Popen(command, preexec_fn=_die_with_parent)
    except OSError as exc:
        print(f"omniprobe.harness.common.supervise: cannot start {command[0]}: {exc}", file=sys.stderr)
        return 127
    # A stop asked while the server was being started reached the group before it joined (or in
    # the forked child before its exec, where this keeper's handler took it): pass it on, or the
    # server runs until the harness's grace ends in SIGKILL. Later ones reach the server directly.
    for sig in dict.fromkeys(asked):
        child.send_signal(sig)
    threading.Thread(target=_watch, args=(args.lifeline, child, args.grace), daemon=True).start()
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
