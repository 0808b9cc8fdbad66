"""`omniprobe host add NAME --like HOST` (issue 34, item 3): this machine's facts into hosts.toml
without editing code, refused where the machine cannot run the probes, and the hostname check
that names it."""

from __future__ import annotations

import argparse
import platform
import socket

import pytest

from omniprobe import cli
from omniprobe.cli.commands.host import run_add
from omniprobe.config.hosts import load_hosts
from omniprobe.env.check_record import env_check
from omniprobe.env.checks import hostname_check, remedy_line
from omniprobe.errors import Refusal

from .fakenvml import FakeNvml, Frame
from .rendered import render_report

GIB = 1024**3


def nvml(**given) -> FakeNvml:
    return FakeNvml([Frame(0, 0)], **{"total": 24 * GIB, "name": "NVIDIA GeForce RTX 3090 Ti",
                                      "compute_capability": (8, 6), **given})


@pytest.fixture
def machine(repo_copy, monkeypatch):
    """The committed project, on a Linux machine called `desk` (its GPU is the test's double)."""
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    monkeypatch.setattr(socket, "gethostname", lambda: "desk")
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    return repo_copy


def add(name="desk3090", like="rtx3090", gpu_index=0, gpu=None, nvidia_smi=None) -> int:
    args = argparse.Namespace(name=name, like=like, gpu_index=gpu_index, nvidia_smi=nvidia_smi)
    return cli.run_command(lambda: run_add(args, nvml=gpu or nvml()))


def test_host_add_appends_this_machine_and_keeps_the_rest_byte_for_byte(machine, capsys):
    before = machine.hosts_file.read_bytes()
    assert add() == 0
    after = machine.hosts_file.read_bytes()
    assert after.startswith(before)  # appended: every earlier byte as it was
    cfg = load_hosts(machine.hosts_file)
    host, like = cfg.hosts["desk3090"], cfg.hosts["rtx3090"]
    assert (host.hostname, host.gpu, host.compute_capability, host.vram_gb, host.card) == (
        "desk", "NVIDIA GeForce RTX 3090 Ti", "8.6", 24, "desk3090")
    assert host.kind == like.kind == "omni"
    assert host.serve_flag_sets == like.serve_flag_sets
    assert host.offline_kwarg_sets == like.offline_kwarg_sets
    assert platform.python_version() in host.python_provider
    card, like_card = cfg.cards["desk3090"], cfg.cards["rtx3090"]
    assert card.memory_total_mib == 24 * 1024
    assert card.memory_total_source.kind == "nvml"
    assert "24576 MiB" in card.memory_total_source.where
    assert (card.overhead_mib, card.other_processes_mib) == (like_card.overhead_mib,
                                                             like_card.other_processes_mib)
    assert card.overhead_source.kind == card.other_processes_source.kind == "assumed"
    out = capsys.readouterr().out
    assert "[hosts.desk3090]" in out and "[cards.desk3090]" in out
    assert "could not know" in out and "overhead_mib (512): an assumption" in out


def test_host_add_reads_the_gpu_at_its_index(machine):
    assert add(gpu_index=1, gpu=nvml(device_count=2)) == 0
    card = load_hosts(machine.hosts_file).cards["desk3090"]
    assert "GPU 1 of 2" in card.memory_total_source.where


def test_validate_accepts_the_new_host_and_the_report_has_it_not_probed_yet(machine):
    assert add() == 0
    assert cli.main(["validate"]) == 0
    unprobed = [line for line in render_report(machine).splitlines()
                if line.startswith("Never probed, so no verdict:")]
    assert len(unprobed) == 1 and "NVIDIA GeForce RTX 3090 Ti" in unprobed[0]


@pytest.mark.parametrize("case, name, like, gpu_index, system, gpu, said", [
    ("not Linux", "desk3090", "rtx3090", 0, "Darwin", nvml(), "runs Darwin, and the probes run on Linux"),
    ("no NVML", "desk3090", "rtx3090", 0, "Linux", nvml(fail_init="Driver Not Loaded"),
     "NVML cannot read a GPU on this machine (NVMLError: Driver Not Loaded)"),
    # Without NVML, both ways forward: run it there, or pass a saved nvidia-smi reading.
    ("no NVML, the next step", "desk3090", "rtx3090", 0, "Linux",
     nvml(fail_init="Driver Not Loaded"), "pip install nvidia-ml-py), or save that machine's "
                                          "`nvidia-smi --query-gpu="),
    ("no such GPU", "desk3090", "rtx3090", 2, "Linux", nvml(device_count=2),
     "--gpu-index 2: NVML sees 2 GPU(s), indices 0..1"),
    ("host name taken", "rtx5080", "rtx3090", 0, "Linux", nvml(),
     "'rtx5080' is already in hosts.toml's [hosts]"),
    ("card name taken", "rtx5090", "rtx3090", 0, "Linux", nvml(),
     "'rtx5090' is already in hosts.toml's [cards]"),
    ("like a simulated host", "desk3090", "sim", 0, "Linux", nvml(), "has no real card's flag sets to copy"),
    ("like an unknown host", "desk3090", "nope", 0, "Linux", nvml(),
     "names host 'nope', which hosts.toml does not define"),
])
def test_host_add_refuses_before_writing(machine, monkeypatch, capsys, case, name, like,
                                         gpu_index, system, gpu, said):
    monkeypatch.setattr(platform, "system", lambda: system)
    before = machine.hosts_file.read_bytes()
    assert add(name, like, gpu_index, gpu) == Refusal.exit_code, case
    assert said in capsys.readouterr().err, case
    assert machine.hosts_file.read_bytes() == before, case


def test_host_add_command_line_takes_its_arguments():
    args = cli.build_parser().parse_args(["host", "add", "mine", "--like", "rtx5080",
                                          "--gpu-index", "1"])
    assert (args.name, args.like, args.gpu_index, args.func) == ("mine", "rtx5080", 1, run_add)


@pytest.mark.parametrize("case, checked, hostname, status, said", [
    ("this machine", "rtx3090", "cachyos-alexander", "pass", "this machine's name"),
    ("another entry's machine", "rtx5080", "cachyos-alexander", "fail",
     "host rtx3090 in hosts.toml is this machine: run with --host rtx3090"),
    ("a machine with no entry", "rtx5080", "vm", "fail",
     "add one with `omniprobe host add NAME --like rtx5080`"),
])
def test_a_hostname_mismatch_names_the_remedy(repo, case, checked, hostname, status, said):
    check = hostname_check(load_hosts(repo.hosts_file), checked, hostname)
    assert (check.status, check.actual) == (status, hostname), case
    assert said in check.detail, case


HOSTNAME = env_check("host.hostname", "fail", "x")
STAMP = env_check("env.stamp", "fail", "x")


@pytest.mark.parametrize("case, failed, said, not_said", [
    ("only the build", [STAMP], "run `", "host add"),
    ("only the hostname", [HOSTNAME], "omniprobe host add", "repairs"),
    ("both", [HOSTNAME, STAMP], "then, for the other checks, run `", None),
])
def test_the_remedy_never_offers_a_build_for_a_hostname(case, failed, said, not_said):
    line = remedy_line(failed, "rtx5080", "probe")
    assert said in line, case
    assert not_said is None or not_said not in line, case


SMI = ("name, memory.total [MiB], compute_cap, driver_version\n"
       "NVIDIA GeForce RTX 5080, 16303 MiB, 12.0, 575.57.08\n"
       "NVIDIA GeForce RTX 3060, 12288 MiB, 8.6, 575.57.08\n")


@pytest.mark.parametrize("gpu_index, name, mib", [
    (0, "NVIDIA GeForce RTX 5080", 16303),
    (1, "NVIDIA GeForce RTX 3060", 12288),
])
def test_a_saved_nvidia_smi_reading_adds_the_card_and_nothing_of_its_machine(
        machine, tmp_path, capsys, gpu_index, name, mib):
    saved = tmp_path / "smi.csv"
    saved.write_text(SMI)
    before = machine.hosts_file.read_bytes()
    # No NVML here at all: the file is the card's only source.
    assert add("mycard", "rtx5080", gpu_index, nvml(fail_init="no NVML"), str(saved)) == 0
    assert machine.hosts_file.read_bytes().startswith(before)
    cfg = load_hosts(machine.hosts_file)
    card = cfg.cards["mycard"]
    assert (card.name, card.memory_total_mib) == (name, mib)
    assert "smi.csv" in card.memory_total_source.where
    assert card.overhead_source.kind == card.other_processes_source.kind == "assumed"
    assert "mycard" not in cfg.hosts  # hostname, Python, host RAM: the file does not say
    out = capsys.readouterr().out
    assert "a card's file says nothing of its machine" in out


@pytest.mark.parametrize("text, said", [
    ("", "line 1: empty"),
    ("name, memory.total [MiB]\nNVIDIA X, 100 MiB\n", "the header lacks compute_cap, driver_version"),
    ("name, memory.total [MiB], compute_cap, driver_version\nNVIDIA X, lots, 8.6, 575\n",
     "line 2: memory.total 'lots': expected '<MiB> MiB'"),
    ("name, memory.total [MiB], compute_cap, driver_version\nNVIDIA X, 100 MiB, eight, 575\n",
     "compute_cap 'eight': expected major.minor"),
    ("name, memory.total [MiB], compute_cap, driver_version\n, 100 MiB, 8.6, 575\n",
     "name: empty"),
    ("name, memory.total [MiB], compute_cap, driver_version\n", "--gpu-index 0: the file lists 0 GPU(s)"),
])
def test_a_malformed_nvidia_smi_reading_is_named_and_writes_nothing(machine, tmp_path, capsys,
                                                                   text, said):
    saved = tmp_path / "smi.csv"
    saved.write_text(text)
    before = machine.hosts_file.read_bytes()
    assert add("mycard", "rtx5080", 0, nvml(), str(saved)) != 0
    err = capsys.readouterr().err
    assert str(saved) in err and said in err and "Traceback" not in err, err
    assert machine.hosts_file.read_bytes() == before


def test_a_gpu_name_is_one_printable_bounded_line_in_hosts_toml(machine):
    hostile = "NVIDIA \u202eGeForce\n[hosts.evil]\r\t\"RTX\" " + "X" * 300
    assert add(gpu=nvml(name=hostile)) == 0
    host = load_hosts(machine.hosts_file).hosts["desk3090"]
    assert "\n" not in host.gpu and "\u202e" not in host.gpu and len(host.gpu) <= 100
    assert host.gpu.startswith('NVIDIA GeForce [hosts.evil] "RTX" XXX')
    assert "evil" not in load_hosts(machine.hosts_file).hosts


def test_host_add_never_writes_through_a_symbolic_link(machine, tmp_path, capsys):
    shared = tmp_path / "shared-hosts.toml"
    shared.write_bytes(machine.hosts_file.read_bytes())
    machine.hosts_file.unlink()
    machine.hosts_file.symlink_to(shared)
    before = shared.read_bytes()
    assert add() == Refusal.exit_code
    assert "is a symbolic link" in capsys.readouterr().err
    assert shared.read_bytes() == before


def test_two_host_adds_take_turns_and_neither_loses_the_others_entry(machine):
    """One holds the project folder's lock: the other waits, then appends to what it wrote."""
    import fcntl
    import os
    import threading
    import time

    folder = os.open(machine.hosts_file.parent, os.O_RDONLY)
    fcntl.flock(folder, fcntl.LOCK_EX)
    done = []
    second = threading.Thread(target=lambda: done.append(add("desk2", gpu=nvml())))
    second.start()
    time.sleep(0.5)
    assert not done  # waiting on the lock, nothing written yet
    # The first writer (this test, holding the lock) appends its own line meanwhile.
    text = machine.hosts_file.read_text()
    machine.hosts_file.write_text(text + "\n# the first writer's line\n")
    os.close(folder)
    second.join(timeout=30)
    assert done == [0]
    after = machine.hosts_file.read_text()
    assert "# the first writer's line" in after and "[hosts.desk2]" in after
