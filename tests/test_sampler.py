"""The NVML sampler against a scripted fake: peak, time of peak, rate, pid de-dup, no NVML."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omniprobe.classify.series import Sample, decimate, summarise
from omniprobe.harness.common.sampler import (
    MIB,
    GpuBusy,
    NvmlReader,
    NvmlUnavailable,
    ProcessMemory,
    Sampler,
    descends_from,
    idle_reading,
    tree_memory,
    unique_processes,
)
from tests.fakenvml import FakeNvml, Frame

ME = os.getpid()


def sampler_over(frames, tmp_path, hz=20.0, seconds=1.0, root=ME):
    reader = NvmlReader(nvml=FakeNvml(frames))
    sampler = Sampler(reader, tmp_path / "series.jsonl", hz=hz, root_pid=lambda: root)
    sampler.start()
    time.sleep(seconds)
    return sampler, sampler.stop()


def test_peak_time_of_peak_and_rate(tmp_path):
    frames = [Frame(0.0, 1000 * MIB, compute=((ME, 500 * MIB),)),
              Frame(0.4, 5000 * MIB, compute=((ME, 4500 * MIB),)),
              Frame(0.7, 2000 * MIB, compute=((ME, 1500 * MIB),))]
    sampler, summary = sampler_over(frames, tmp_path, hz=20.0, seconds=1.0)
    assert summary.peak_mib == 4500 and summary.peak_source == "process"
    assert summary.device_peak_mib == 5000
    assert 0.4 <= summary.peak_t_s < 0.75
    assert 15 <= summary.rate_hz <= 21 and 15 <= summary.samples <= 22
    lines = (tmp_path / "series.jsonl").read_text().splitlines()
    assert len(lines) == summary.samples
    assert max(json.loads(line)["process_mib"] for line in lines) == 4500


def test_each_process_is_counted_once(tmp_path):
    frames = [Frame(0.0, 6000 * MIB, compute=((ME, 4000 * MIB), (1, 1000 * MIB)),
                    graphics=((ME, 4000 * MIB),))]
    _, summary = sampler_over(frames, tmp_path, seconds=0.2)
    assert summary.peak_mib == 4000


def test_unmatched_pids_fall_back_to_device_totals(tmp_path):
    # NVML in a container lists host pids, which are not ours.
    frames = [Frame(0.0, 3000 * MIB, compute=((4_000_000, 2500 * MIB),))]
    _, summary = sampler_over(frames, tmp_path, seconds=0.2)
    assert summary.peak_source == "device" and summary.peak_mib == 3000


def test_unknown_process_memory_falls_back_to_device(tmp_path):
    frames = [Frame(0.0, 3000 * MIB, compute=((ME, None),))]
    _, summary = sampler_over(frames, tmp_path, seconds=0.2)
    assert summary.peak_source == "device"


def test_samples_reach_the_file_while_sampling(tmp_path):
    reader = NvmlReader(nvml=FakeNvml([Frame(0.0, 10 * MIB)]))
    with Sampler(reader, tmp_path / "s.jsonl", hz=50) as sampler:
        time.sleep(0.3)
        assert len((tmp_path / "s.jsonl").read_text().splitlines()) >= 5
        assert sampler.samples


def test_rate_at_ten_hz(tmp_path):
    _, summary = sampler_over([Frame(0.0, MIB)], tmp_path, hz=10.0, seconds=1.05)
    assert summary.target_hz == 10.0
    assert 9 <= summary.rate_hz <= 10.5 and 10 <= summary.samples <= 12


def test_without_nvml_the_reader_says_why():
    with pytest.raises(NvmlUnavailable, match="NVML Shared Library Not Found"):
        NvmlReader(nvml=FakeNvml([Frame(0.0, 0)], fail_init="NVML Shared Library Not Found"))


def test_a_failing_reader_ends_the_series_not_the_run(tmp_path):
    fake = FakeNvml([Frame(0.0, MIB)])
    reader = NvmlReader(nvml=fake)
    sampler = Sampler(reader, tmp_path / "s.jsonl", hz=50)
    sampler.start()
    time.sleep(0.1)
    fake.frames = []  # the next read fails
    time.sleep(0.1)
    summary = sampler.stop()
    assert summary.samples >= 1 and "sampling stopped" in summary.reason


def test_unique_processes_and_tree_memory():
    compute = [ProcessMemory(10, 100), ProcessMemory(11, 50)]
    graphics = [ProcessMemory(10, 100), ProcessMemory(12, 7)]
    assert unique_processes(compute, graphics) == {10: 100, 11: 50, 12: 7}
    assert tree_memory(compute, graphics, {10, 11}) == 150
    assert tree_memory(compute, graphics, {99}) is None


def test_descends_from_follows_the_parent_chain():
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(5)']); "
            "print(p.pid, flush=True); p.wait()")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(child.stdout.readline())
        assert descends_from(grandchild, ME)
        assert descends_from(grandchild, child.pid)
        assert not descends_from(child.pid, grandchild)
        assert not descends_from(1, ME)
    finally:
        child.kill()
        child.wait()
        os.kill(grandchild, 9)


def test_summary_of_nothing_and_decimation_keeps_the_peak():
    assert summarise([], 10, "NVML").samples == 0
    samples = [Sample(t_s=i / 10, device_mib=float(i % 7), process_mib=float(i % 5))
               for i in range(1000)]
    samples[637] = Sample(t_s=63.7, device_mib=99.0, process_mib=88.0)
    points = decimate(samples, buckets=50)
    assert len(points) <= 50
    assert max(p.device_mib for p in points) == 99.0
    assert max(p.process_mib for p in points) == 88.0
    assert any(p.t_s == 63.7 for p in points)


def test_the_idle_wait_names_the_holder():
    fake = FakeNvml([Frame(0.0, 9000 * MIB, compute=((4242, 8000 * MIB),))],
                    names={4242: "python3"})
    with pytest.raises(GpuBusy, match=r"pid 4242 \(python3\) holds 8,000 MiB"):
        idle_reading(NvmlReader(nvml=fake), None, timeout_s=0.3, poll_s=0.05)


def test_the_idle_wait_waits_for_memory_to_return_to_the_first_idle_reading():
    fake = FakeNvml([Frame(0.0, 5000 * MIB), Frame(0.3, 600 * MIB)])
    started = time.monotonic()
    idle = idle_reading(NvmlReader(nvml=fake), 500 * MIB, timeout_s=5, poll_s=0.05)
    assert (idle.first_idle, idle.used) == (500 * MIB, 600 * MIB)
    assert time.monotonic() - started >= 0.25
    with pytest.raises(GpuBusy, match="5,000 MiB in use against the first idle reading of 500 MiB"):
        idle_reading(NvmlReader(nvml=FakeNvml([Frame(0.0, 5000 * MIB)])), 500 * MIB,
                     timeout_s=0.2, poll_s=0.05)


def test_the_idle_wait_takes_its_first_reading_as_the_first_idle_reading():
    fake = FakeNvml([Frame(0.0, 700 * MIB, compute=((ME, 100 * MIB),))])
    assert idle_reading(NvmlReader(nvml=fake), None, timeout_s=1).first_idle == 700 * MIB


def test_a_series_file_that_cannot_be_written_leaves_the_series_whole(tmp_path):
    """/dev/full answers every write with ENOSPC, as a full artifacts disk does: the thread
    raises nothing, samples go on in memory, and the summary says the file is short."""
    frames = [Frame(0.0, 1000 * MIB, compute=((ME, 500 * MIB),)),
              Frame(0.2, 3000 * MIB, compute=((ME, 2500 * MIB),))]
    reader = NvmlReader(nvml=FakeNvml(frames))
    sampler = Sampler(reader, Path("/dev/full"), hz=20.0, root_pid=lambda: ME)
    sampler.start()
    time.sleep(0.4)
    summary = sampler.stop()
    assert summary.peak_mib == 2500 and summary.samples >= 5
    assert summary.reason == ("the series file full holds the first 0 sample(s) only (No space "
                              "left on device); the summary holds them all")


def test_a_published_reader_shows_a_peak_reached_between_two_samples(tmp_path):
    import os

    from omniprobe.harness.common.sampler import PUBLISHED_MEMORY, PublishedMemoryReader

    path = tmp_path / "memory"
    reader = PublishedMemoryReader(path)
    assert reader.memory() == (0, 0) and reader.processes() == ([], [])

    def publish(used, peak):
        path.write_bytes(PUBLISHED_MEMORY.pack(os.getpid(), used, 1000, peak))

    publish(100, 500)  # a request came and went since the last sample
    assert reader.memory() == (500, 1000)
    assert [p.used for p in reader.processes()[0]] == [500]
    assert reader.memory() == (100, 1000)  # the same peak is not shown twice
    publish(300, 500)
    assert reader.memory() == (300, 1000)
    publish(200, 700)
    assert reader.memory() == (700, 1000)
