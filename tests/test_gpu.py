"""On a real NVIDIA GPU: the torch-backed sim, PyTorch's own OOM text, and the NVML sampler.

Run from the repository root with only python3, torch (CUDA build), pydantic, requests, numpy,
pillow, nvidia-ml-py and pytest installed:

    PYTHONPATH=src python3 -m pytest -m gpu tests/test_gpu.py -s -rA

Each test prints what it measured, for the closing note of the run.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from omniprobe.analysis.oom import parse_oom
from omniprobe.config.fixtures import load_fixtures
from omniprobe.config.hosts import load_hosts
from omniprobe.harness import client
from omniprobe.harness.sampler import MIB, NvmlReader, Sampler
from omniprobe.harness.server import Endpoints, ServerProcess, server_command, server_env

try:
    import torch

    CUDA = torch.cuda.is_available()
except ImportError:
    torch = None
    CUDA = False

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not CUDA, reason="CUDA is absent: needs an NVIDIA GPU and torch built with CUDA")]

CAP_GIB = 24


def _nvml_index() -> int:
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def test_torch_sim_four_reference_oom_and_the_sampler_matches_its_account(project, port,
                                                                          monkeypatch):
    monkeypatch.setenv("OMNIPROBE_SIM_TIME_SCALE", "1")  # keep each modelled state >= 250 ms
    cfg = load_hosts(project.hosts_file)
    suite = load_fixtures(project.fixtures_file)
    command = server_command(cfg, "sim", "cpuoff", port=port, model="Qwen/Qwen-Image-2.1",
                             hosts_file=project.hosts_file)
    command += ["--torch", "--torch-cap-gib", str(CAP_GIB)]
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(command, server_env(cfg, "cpuoff", dict(os.environ)),
                           project.root / "server.log", Endpoints(url), grace_s=10)
    replies = {}
    with server:
        sampler = Sampler(NvmlReader(_nvml_index()), project.root / "timeline.jsonl", hz=10,
                          root_pid=lambda: server.pid, t0=server.started)
        with sampler:
            init = server.wait_ready(600, 0.25)
            assert init.outcome == "ready", server.log_path.read_text()[-3000:]
            for fixture in ("sim-three", "sim-four", "sim-single"):
                replies[fixture] = client.send(url, suite.get(fixture), 2301, suite.sampling,
                                               project.fixtures_file.parent, 300)
                time.sleep(0.5)
        summary = sampler.summary()
    log = server.log_path.read_text()
    accounts = [json.loads(line.split("sim account: ", 1)[1])
                for line in log.splitlines() if line.startswith("sim account: {")]
    four = replies["sim-four"]
    print(f"\nfour-reference reply: {four.outcome}, HTTP {four.status}\n{four.error}")
    print(f"sampler: {summary.samples} samples at {summary.rate_hz} Hz, server peak "
          f"{summary.peak_mib} MiB ({summary.peak_source}) at {summary.peak_t_s} s; "
          f"sim account: {accounts[-1]}")

    assert replies["sim-three"].outcome == "ok"
    assert four.outcome == "oom" and four.status == 500
    assert "CUDA out of memory. Tried to allocate 1.50 GiB." in four.error
    assert four.oom.allowed == f"{CAP_GIB}.00 GiB" and four.oom.requested == "1.50 GiB"
    assert four.oom.allocated is not None and four.oom.total_capacity is not None
    logged = parse_oom(log, "request", tuple(cfg.host("sim").model_code))
    assert "torch.OutOfMemoryError" in log or "torch.cuda.OutOfMemoryError" in log
    assert logged.location.file == "omniprobe/sim/model.py"
    assert logged.location.function == "image_mlp"
    assert replies["sim-single"].outcome == "ok"  # the server stays up after the OOM

    held = accounts[-1]["held_mib"]
    assert accounts[-1]["backend"] == "torch" and accounts[-1]["context_mib"] > 0
    assert summary.peak_source == "process"
    assert abs(summary.peak_mib - held) <= 0.02 * held, (summary.peak_mib, held)


def test_sampler_catches_a_200_ms_spike_at_10_hz(tmp_path):
    torch.zeros(1, device="cuda")  # this process's CUDA context first, outside the spike
    sampler = Sampler(NvmlReader(_nvml_index()), tmp_path / "spike.jsonl", hz=10,
                      root_pid=os.getpid)
    with sampler:
        time.sleep(0.6)
        spike = torch.empty(4 * 1024**3, dtype=torch.uint8, device="cuda").fill_(1)
        torch.cuda.synchronize()
        time.sleep(0.2)
        del spike
        torch.cuda.empty_cache()
        time.sleep(0.6)
    baseline = min(s.process_mib for s in sampler.samples if s.process_mib is not None)
    peak = sampler.summary().peak_mib
    print(f"\nspike: baseline {baseline:.0f} MiB, peak {peak:.0f} MiB, "
          f"{len(sampler.samples)} samples at {sampler.summary().rate_hz} Hz")
    assert peak - baseline >= 0.98 * 4096
    assert sum(s.process_mib is not None and s.process_mib - baseline > 4000
               for s in sampler.samples) <= 3  # it was a spike, not a plateau


def test_process_memory_counts_each_pid_once_on_a_real_device():
    torch.zeros(1, device="cuda")
    reader = NvmlReader(_nvml_index())
    compute, graphics = reader.processes()
    mine = [p for p in compute + graphics if p.pid == os.getpid()]
    assert mine, "NVML does not list this process (container pid namespace?)"
    used, total = reader.memory()
    assert 0 < mine[0].used <= used <= total
    print(f"\nthis process: {mine[0].used / MIB:.0f} MiB of {total / MIB:.0f} MiB")
