"""What a probe session will do, said in one line before it spends GPU time: the host, the
attempt (new or resumed, and why), flag sets x fixtures x seeds, the cells already recorded, and
an estimate of the time from the host's own earlier attempts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Protocol, TextIO

from omniprobe.evidence.attempts import AttemptStore, probe_attempts
from omniprobe.evidence.load import LoadedAttempt, load_attempt
from omniprobe.evidence.models.common import FailureCause


@dataclass(frozen=True)
class Pace:
    """Mean times of the host's earlier probe attempts; None where they hold none."""

    init_s: float | None
    request_s: float | None
    attempts: int


class Init(Protocol):
    """An init on record: a server lifetime's (InitResult) or an offline entry's failed one."""

    @property
    def outcome(self) -> str: ...

    @property
    def cause(self) -> FailureCause | None: ...


def init_settled(init: Init | None, accept_timeouts: bool = False) -> bool:
    """Whether an init is on record for good: ready, or failed for the card or the server
    software. One the environment failed (a full disk, a busy port) measured nothing about the
    card: a re-run starts that server or runner again, as it sends a lost request again; so with
    a timeout, which is no answer of the card's, unless the run accepts timeouts."""
    if init is None or (init.outcome == "timeout" and not accept_timeouts):
        return False
    cause = init.cause
    return init.outcome == "ready" or cause is None or cause.kind != "environment"


def unsettled(store: AttemptStore, flag_sets: list[str], cells: list[tuple[str, int]]) -> list[str]:
    """What the attempt leaves unsettled of a run asking for each flag set's init and, under it,
    every (fixture, seed) cell: one line per flag set. A cell is settled when it is measured,
    whatever came out (ok, oom, a broken image), or implied by its flag set's init failure on
    record; a lost request (transport failure) or an init the environment failed settles
    nothing. Empty: the run is done (exit 0), whatever the card answered."""
    left = []
    for flag_set in flag_sets:
        run = store.run(flag_set)
        if run is None:
            left.append(f"{flag_set}: no init on record")
        elif not init_settled(run.init, store.accept_timeouts):
            why = (f"timed out ({run.init.note}): not the card's answer; re-run, or "
                   "--accept-timeouts" if run.init.outcome == "timeout"
                   else f"for an environment cause ({run.init.cause.reason})")
            left.append(f"{flag_set}: init {run.init.outcome} {why}")
        elif run.init.outcome == "ready":
            missing = sum(not store.recorded(flag_set, f, s) for f, s in cells)
            if missing:
                left.append(f"{flag_set}: {missing} of {len(cells)} cell(s) not measured")
    return left


def attempt_complete(store: AttemptStore, flag_sets: list[str],
                     cells: list[tuple[str, int]]) -> bool:
    """Whether the attempt settles every flag set's init and every cell under those that came
    up ready."""
    return not unsettled(store, flag_sets, cells)


def settled_line(left: list[str]) -> str:
    """The probe's last line, which its exit status agrees with: 0 when nothing is left."""
    if not left:
        return ("done: every init and cell this run asks for is settled (measured, or implied "
                "by its flag set's init failure on record)")
    return (f"not settled: {len(left)} flag set(s) hold an unmeasured init or cells (named "
            "above; exit 1): re-run to measure them")


def settled_exit(left: list[str], out: TextIO) -> int:
    """A session's ending: each thing left unsettled on a line, then the last line; the exit
    status agrees with it (0 when nothing is left)."""
    for line in left:
        print(f"unsettled: {line}", file=out)
    print(settled_line(left), file=out)
    return 1 if left else 0


def earlier_attempts(host_dir: Path, current: str) -> list[LoadedAttempt]:
    """The host's readable probe attempts other than `current` (validate reports the others)."""
    found = []
    for folder in probe_attempts(host_dir):
        loaded, problems = load_attempt(folder)
        if loaded is not None and not problems and loaded.id != current:
            found.append(loaded)
    return found


def pace(attempts: list[LoadedAttempt]) -> Pace:
    """Mean init time of a ready server and mean wall time of a request, over the attempts."""
    inits = [lt.init.time_s for a in attempts for run in a.runs for lt in run.lifetimes
             if lt.init.outcome == "ready"]
    walls = [r.wall_s for a in attempts for r in a.requests]
    return Pace(fmean(inits) if inits else None, fmean(walls) if walls else None, len(attempts))


def estimate(p: Pace, starts: int, requests: int) -> str:
    """The time `starts` server starts and `requests` requests took on this host before."""
    if not starts and not requests:
        return "nothing to run"
    if p.attempts == 0 or (starts and p.init_s is None) or (requests and p.request_s is None):
        return "no estimate (no earlier attempt of this host measured it)"
    seconds = starts * (p.init_s or 0.0) + requests * (p.request_s or 0.0)
    return (f"about {_duration(seconds)} at the pace of this host's {p.attempts} earlier "
            f"attempt(s)")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def plan_line(session: str, host: str, attempt: str, why: str, *, flag_sets: int, fixtures: int,
              seeds: int, recorded: int, to_run: int, time: str, rerun_command: str) -> str:
    """The one line: probe-init counts flag sets (fixtures=0), probe-serve cells."""
    shape = (f"{flag_sets} flag set(s)" if not fixtures else
             f"{flag_sets} flag set(s) x {fixtures} fixture(s) x {seeds} seed(s)")
    line = (f"{session} on {host}: attempt {attempt} ({why}); {shape}: {recorded} already "
            f"recorded, {to_run} to run; {time}")
    return line + (f"; to measure again: {rerun_command}" if not to_run else "")
