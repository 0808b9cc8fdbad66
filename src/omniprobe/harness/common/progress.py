"""What the terminal shows while a probe runs: the run, the request, elapsed time and an ETA."""

from __future__ import annotations

import time
from typing import TextIO


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def eta_s(elapsed: float, done: int, total: int) -> float | None:
    return None if done == 0 else elapsed / done * (total - done)


class Progress:
    """One line per step on the terminal: the run, the request, elapsed time and an ETA."""

    def __init__(self, total: int, out: TextIO):
        self.total, self.out, self.done = total, out, 0
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def step(self, text: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.t0
        eta = eta_s(elapsed, self.done, self.total)
        self.say(f"{text} | {self.done}/{self.total} | elapsed {clock(elapsed)}"
                 + (f" | ETA {clock(eta)}" if eta is not None else ""))
