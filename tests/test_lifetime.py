"""The one supervised lifetime both probes run their process through (harness/common/lifetime.py):
what it does on each way a lifetime ends, apart from any probe."""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import pytest

from omniprobe.config.hosts import load_hosts
from omniprobe.harness.common.emulation import EmulationUnguarded
from omniprobe.harness.common.lifetime import Lifetimes, ProcessSpec, SamplerDied
from omniprobe.harness.common.processes import alive
from omniprobe.harness.common.sampler import NvmlUnavailable

from .conftest import REPO

SECRET = "hf_lifetimesecretvalue0123456789"
SETTINGS = SimpleNamespace(grace_s=2.0, sample_hz=20.0, idle_timeout_s=2.0, cap_mib=None,
                           gpu_index=0)


def no_nvml(folder):
    raise NvmlUnavailable("no NVML on this machine")


class CutReader:
    """A GPU that reads idle once (the idle wait), then fails: the sampler's series is cut."""

    label = "a reader that fails"

    def __init__(self):
        self.reads = 0

    def memory(self):
        self.reads += 1
        if self.reads > 1:
            raise OSError("the device went away")
        return 0, 1024**3

    def processes(self):
        return [], []

    def process_name(self, pid):
        return "?"


def lifetimes(tmp_path, readers, **settings) -> Lifetimes:
    host = load_hosts(REPO / "hosts.toml").host("rtx3090")
    return Lifetimes("rtx3090", host, SimpleNamespace(**{**vars(SETTINGS), **settings}), readers,
                     tmp_path)


def spec(tmp_path, code: str) -> ProcessSpec:
    return ProcessSpec([sys.executable, "-c", code], {"HF_TOKEN": SECRET, "PATH": "/usr/bin:/bin"},
                       tmp_path / "one" / "runner.log", "runner", "entry", "runner 0")


def test_a_lifetime_whose_body_fails_stops_the_group_and_records_a_redacted_log(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)  # the harness's own secret, as the redaction reads it
    kept = []
    started = tmp_path / "one" / "started"
    code = (f"import os, time; print(os.environ['HF_TOKEN'], flush=True); "
            f"open({str(started)!r}, 'w').close(); time.sleep(60)")
    with pytest.raises(RuntimeError, match="the body failed"), \
            lifetimes(tmp_path, no_nvml).run(spec(tmp_path, code), kept.append) as running:
        while not started.exists():
            time.sleep(0.02)
        pid = running.process.pid
        raise RuntimeError("the body failed")
    assert not alive(pid, group=True)
    [end] = kept
    assert end.ended == "stopped"
    assert end.timeline.state == "unavailable" and "no NVML" in end.timeline.reason
    log = (tmp_path / "one" / "runner.log").read_text()
    assert SECRET not in log and "<redacted>" in log
    assert end.log.path == "one/runner.log"
    # The process runs on the device the sampler watches; uncapped, no guard.
    assert running.process.env["CUDA_VISIBLE_DEVICES"] == "0" and running.guard is None


def test_an_emulated_cap_that_cannot_be_sampled_starts_nothing(tmp_path):
    kept = []
    with pytest.raises(EmulationUnguarded, match="its runner's memory cannot be sampled"), \
            lifetimes(tmp_path, no_nvml, cap_mib=1024).run(spec(tmp_path, "pass"), kept.append):
        pytest.fail("the body ran")
    assert kept == [] and not (tmp_path / "one" / "runner.log").exists()


def test_a_cut_series_is_recorded_as_incomplete_before_the_lifetime_fails_for_it(tmp_path):
    kept = []
    with pytest.raises(SamplerDied, match=r"\[entry\] sampling stopped: OSError.*runner 0 is "
                                          "recorded as incomplete"), \
            lifetimes(tmp_path, lambda folder: CutReader()).run(
                spec(tmp_path, "import time; time.sleep(60)"), kept.append) as running:
        while running.sampler.died is None:
            time.sleep(0.02)
    [end] = kept
    assert end.timeline.state == "incomplete" and end.idle.first_idle == 0
    assert end.ended == "stopped"


def test_a_stop_asked_before_the_server_exists_reaches_it(tmp_path):
    """The keeper ignores the group's SIGTERM for itself; one that comes while it is still
    starting the server (before the server is in the group) is passed on, so the server stops
    at once instead of after the harness's grace and a SIGKILL. The keeper runs in a session of
    its own, with the stop sent to it just before it starts the server."""
    import os
    import signal
    import subprocess

    keeper = (
        "import os, signal, sys\n"
        "from omniprobe.harness.common import supervise\n"
        "real = supervise.subprocess.Popen\n"
        "def stop_asked_first(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(*args, **kwargs)\n"
        "supervise.subprocess.Popen = stop_asked_first\n"
        "sys.exit(supervise.main(sys.argv[1:]))\n")
    read_end, write_end = os.pipe()
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", keeper, "--lifeline", str(read_end), "--grace", "2", "--",
             sys.executable, "-c", "import time; time.sleep(30)"],
            pass_fds=(read_end,), start_new_session=True, timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    finally:
        os.close(read_end)
        os.close(write_end)
    assert done.returncode == 128 + signal.SIGTERM
    assert time.monotonic() - started < 10  # not the server's 30 s
