"""The host-RAM rule (issue 23 item 5, shared with issue 22): a table in the order of the signs'
strength, each row a failure and what the rule calls it."""

from __future__ import annotations

import pytest

from omniprobe.classify.host_ram import GPU_ROOM_MIB, LOW_AVAILABLE_MIB, host_ram_fit, memory_failure

TORCH_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a "
             "total capacity of 23.56 GiB of which 812.00 MiB is free.")
DRIVER_OOM = "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be reported ..."
LOW, PLENTY = [4096.0, 1800.0, 310.0], [20480.0, 20400.0]


@pytest.mark.parametrize(("oom_kills", "returncode", "available", "text", "gpu_free", "kind"), [
    # 1. the cgroup's oom_kill count rose: the host's, whatever else the process left
    ((0, 1), -9, None, "", None, "host-ram"),
    ((3, 4), 1, PLENTY, TORCH_OOM, 100.0, "host-ram"),
    ((2, 2), 0, None, "", None, None),                 # no kill counted
    # 2. SIGKILL with the host's available memory low in the last readings
    (None, -9, LOW, "", None, "host-ram"),
    (None, 137, LOW, "", None, "host-ram"),            # a keeper's 128 + 9
    ((1, 1), -9, LOW, "", None, "host-ram"),           # a cgroup that counted none: the next sign
    (None, -9, PLENTY, "", None, None),                # someone else's SIGKILL
    (None, -9, None, "", None, None),                  # no readings: nothing says it was memory
    (None, -15, LOW, "", None, None),                  # SIGTERM is not the OOM killer's
    (None, 1, LOW, "", None, None),                    # an exit of its own
    (None, None, LOW, "", None, None),                 # still running (an error answer)
    # 3. PyTorch's CUDA OOM text: the GPU's
    (None, 1, PLENTY, TORCH_OOM, 100.0, "gpu-oom"),
    (None, -9, PLENTY, TORCH_OOM, None, "gpu-oom"),
    # 4. a driver-level "out of memory": the host's with the GPU's room, else the GPU's
    (None, 1, PLENTY, DRIVER_OOM, GPU_ROOM_MIB, "host-ram"),
    (None, 1, PLENTY, DRIVER_OOM, GPU_ROOM_MIB - 1, "gpu-oom"),
    (None, 1, PLENTY, DRIVER_OOM, None, None),         # the GPU's room unknown
    # neither
    (None, 1, PLENTY, "ValueError: bad prompt", 9000.0, None),
    (None, None, None, "", None, None),
])
def test_the_signs_in_order_of_strength(oom_kills, returncode, available, text, gpu_free, kind):
    found = memory_failure(oom_kills, returncode, available, text, gpu_free)
    assert (found.kind if found else None) == kind


def test_the_sign_says_what_showed_it():
    assert memory_failure((0, 2), -9, None, "", None).sign == (
        "the kernel's OOM killer: the cgroup's memory.events oom_kill went from 0 to 2")
    assert memory_failure(None, -9, LOW, "", None).sign == (
        "killed by SIGKILL (exit -9) with the host's available memory at 310 MiB in the "
        "sampler's last readings")


def test_low_is_below_the_threshold():
    assert memory_failure(None, -9, [LOW_AVAILABLE_MIB - 1], "", None) is not None
    assert memory_failure(None, -9, [LOW_AVAILABLE_MIB], "", None) is None


def test_the_host_cause_counts_as_evidence_about_the_card_on_its_host():
    from omniprobe.classify.failure_cause import host_ram_cause, is_card_evidence

    cause = host_ram_cause((0, 1), -9, None, "", None)
    assert (cause.kind, cause.reason) == ("host", "host RAM exhausted: the kernel's OOM killer: "
                                                  "the cgroup's memory.events oom_kill went from "
                                                  "0 to 1")
    assert is_card_evidence("error", cause)
    assert host_ram_cause(None, 1, None, TORCH_OOM, None) is None  # the GPU's: classify_failure


def test_the_kernels_readings_where_it_shows_them_and_none_where_not(tmp_path):
    from omniprobe.harness.common.host_memory import available_mib, oom_kill_count

    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 32768000 kB\nMemAvailable:  1048576 kB\n")
    assert available_mib(proc) == 1024.0
    assert oom_kill_count(proc, cgroups) is None  # no /proc/self/cgroup
    (proc / "self" / "cgroup").write_text("4:memory:/x\n0::/user.slice/probe.scope\n")
    assert oom_kill_count(proc, cgroups) is None  # no memory controller there
    (cgroups / "user.slice" / "probe.scope").mkdir(parents=True)
    (cgroups / "user.slice" / "probe.scope" / "memory.events").write_text(
        "low 0\nhigh 0\nmax 0\noom 2\noom_kill 3\noom_group_kill 0\n")
    assert oom_kill_count(proc, cgroups) == 3
    (proc / "self" / "cgroup").write_text("4:memory:/x\n")  # cgroup v1 only
    assert oom_kill_count(proc, cgroups) is None
    (proc / "meminfo").write_text("MemTotal: 1 kB\n")
    assert available_mib(proc) is None


# --- a run's host footprint against its card's host RAM (issue 32 item 3) ---------------------

GIB = 1024
RAM = 30 * GIB  # the seed's 5080 host: "30 GiB + zram"


@pytest.mark.parametrize(("footprint", "pinned", "cap", "killed", "fits", "words"), [
    # Within the RAM, pinned or not: it fits, and says by how much.
    (28 * GIB, 0.0, None, False, True, "within the host's 30.0 GiB of RAM by 2.0 GiB"),
    (29 * GIB, 16 * GIB, None, False, True, "by 1.0 GiB, 16.0 GiB of it pinned"),
    (30 * GIB, None, None, False, True, "within the host's 30.0 GiB of RAM by 0.0 GiB"),
    # Over the RAM: never a fit. Swap or zram is not counted for it, even where all of it is
    # pageable (random weights do not compress as real ones do, and zram is not emulated)...
    (31 * GIB, 0.0, None, False, False,
     "over the host's 30.0 GiB of RAM by 1.0 GiB; only its pageable part could go to swap or "
     "zram, which is neither emulated nor counted"),
    (42.4 * GIB, None, None, False, False, "over the host's 30.0 GiB of RAM by 12.4 GiB"),
    # ... and where the pinned part alone is over the RAM no swap could ever take it.
    (42.4 * GIB, 32 * GIB, None, False, False, "page-locked memory alone exceeds the RAM"),
    # Pinned over the RAM is no fit even where no footprint was read.
    (None, 31 * GIB, None, False, False, "not known against"),
    # Under a cap no larger than the RAM it held no more than the cap.
    (None, None, 30 * GIB, False, True, "within the host's 30.0 GiB of RAM (held under a cap"),
    (None, None, 32 * GIB, False, None, "not known against the host's 30.0 GiB of RAM"),
    (None, None, None, False, None, "not known"),
    # Killed at the cap: over, whatever it read before.
    (29 * GIB, 0.0, 30 * GIB, True, False, "the kernel killed the runner at the cap"),
])
def test_a_runs_host_footprint_is_held_against_the_ram_alone(footprint, pinned, cap, killed,
                                                             fits, words):
    verdict = host_ram_fit(RAM, footprint_mib=footprint, pinned_mib=pinned, cap_mib=cap,
                           killed=killed)
    assert verdict.fits is fits
    assert words in verdict.text(), verdict.text()
    if footprint is not None:
        assert verdict.margin_mib == RAM - footprint
