"""The terminal's elapsed time and ETA."""

from __future__ import annotations

import io

from omniprobe.harness.common.progress import Progress, clock, eta_s


def test_clock_and_eta():
    assert clock(0) == "0:00" and clock(75.4) == "1:15" and clock(3725) == "1:02:05"
    assert eta_s(10.0, 0, 8) is None
    assert eta_s(10.0, 2, 8) == 30.0 and eta_s(10.0, 8, 8) == 0.0


def test_each_step_says_where_it_is():
    out = io.StringIO()
    progress = Progress(3, out)
    progress.say("[cpuoff 1/2] starting the server")
    progress.step("[cpuoff 1/2] sim-pair seed 2301: ok 0.41 s")
    lines = out.getvalue().splitlines()
    assert lines[0] == "[cpuoff 1/2] starting the server"
    assert lines[1].startswith("[cpuoff 1/2] sim-pair seed 2301: ok 0.41 s | 1/3 | elapsed 0:00")
    assert "| ETA 0:00" in lines[1]
